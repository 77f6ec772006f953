"""The error an endpoint answers in Vast's shape, raised wherever a request is refused."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answered in Vast's shape: ``{"success": false, "error": ..., "msg": ...}``."""

    def __init__(self, status: int, error: str, msg: str, **extra: Any) -> None:
        super().__init__(msg)
        self.status, self.error, self.msg, self.extra = status, error, msg, extra

    def body(self) -> dict[str, Any]:
        return {"success": False, "error": self.error, "msg": self.msg, **self.extra}
