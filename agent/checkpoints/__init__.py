"""Checkpoint directories <-> one object in storage: find, pack, upload, download, unpack.

One question per file:

- protocol.py: which folders are checkpoints, as their markers say (ready to upload, uploaded,
  already on this disk to resume from); the script's own half is ``agent.mark_ready``;
- pack.py: what bytes a folder becomes (the tar of PROTOCOL.md §3, ngck1-encrypted or not),
  sized before anything is read;
- upload.py: how those bytes reach storage (one PUT, or parts a few at a time);
- ranged.py: how a stored object's bytes come back (parallel ranged GETs, read in order);
- download.py: ``restore`` into a folder and ``fetch_file`` into a file, unpacked or decrypted
  while the bytes arrive, and the old sequential path the benchmarks compare against;
- archives.py: how a tar's bytes become files, and only safe ones;
- errors.py: what can go wrong; transfer.py: the byte counter every transfer adds to.

This module re-exports the public names, so that callers keep ``from agent import checkpoints
as ck`` and ``ck.restore(...)``. The tunables (``RETRY_BASE_S``, ``RANGED_MIN_SIZE``, ...) are
read where they are used: change them in their own module (``agent.checkpoints.ranged``), not
here; ``PARTS_IN_FLIGHT`` and ``READ_CHUNK`` are re-exported to be read only.
"""

from agent.checkpoints.archives import (
    CHECKPOINT,
    ArchiveFormat,
    extract_member,
    extract_object,
    extract_safely,
    member_path,
)
from agent.checkpoints.download import (
    RestoreStats,
    download_verified,
    fetch_file,
    restore,
    unpack,
)
from agent.checkpoints.errors import (
    Cancelled,
    CheckpointChanged,
    DownloadError,
    RestoreError,
    StorageError,
    UnsafeArchive,
)
from agent.checkpoints.pack import (
    PROTOCOL_FILES,
    TarPlan,
    new_crypt,
    object_pieces,
    object_size,
    plan_tar,
    tar_pieces,
)
from agent.checkpoints.protocol import (
    ReadyCheckpoint,
    find_ready,
    local_copy,
    mark_restored,
    mark_uploaded,
)
from agent.checkpoints.transfer import READ_CHUNK, ByteCounter
from agent.checkpoints.upload import PARTS_IN_FLIGHT, Uploaded, upload_object

__all__ = [
    "CHECKPOINT",
    "PARTS_IN_FLIGHT",
    "PROTOCOL_FILES",
    "READ_CHUNK",
    "ArchiveFormat",
    "ByteCounter",
    "Cancelled",
    "CheckpointChanged",
    "DownloadError",
    "ReadyCheckpoint",
    "RestoreError",
    "RestoreStats",
    "StorageError",
    "TarPlan",
    "UnsafeArchive",
    "Uploaded",
    "download_verified",
    "extract_member",
    "extract_object",
    "extract_safely",
    "fetch_file",
    "find_ready",
    "local_copy",
    "mark_restored",
    "mark_uploaded",
    "member_path",
    "new_crypt",
    "object_pieces",
    "object_size",
    "plan_tar",
    "restore",
    "tar_pieces",
    "unpack",
    "upload_object",
]
