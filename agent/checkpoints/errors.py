"""What can go wrong with a checkpoint object, packing it, storing it or restoring it."""

from __future__ import annotations


class CheckpointChanged(Exception):
    """A file changed, appeared or vanished while its checkpoint was being packed."""


class UnsafeArchive(Exception):
    """A tar member would land outside the target directory or is not a plain file/directory."""


class StorageError(Exception):
    def __init__(self, message: str, *, expired: bool = False) -> None:
        super().__init__(message)
        self.expired = expired  # the presigned URL is no longer accepted: ask for new ones


class Cancelled(Exception):
    """The agent is shutting down (token dead); abandon the transfer."""


class RestoreError(Exception):
    """The checkpoint to resume from could not be fetched, verified or unpacked."""


class DownloadError(RestoreError):
    """Fetching or verifying the object failed; fetching it again may succeed."""
