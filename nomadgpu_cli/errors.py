"""What a command ends with: its exit code, and ``CliError``, the failure that carries one."""

from __future__ import annotations

EXIT_OK, EXIT_JOB_FAILED, EXIT_REFUSED, EXIT_AUTH, EXIT_UNREACHABLE = 0, 1, 2, 3, 4


class CliError(Exception):
    def __init__(self, message: str, code: int, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status  # the server's HTTP status, when it answered
