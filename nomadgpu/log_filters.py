"""Logging filters for the console (``settings.LOGGING``)."""

from __future__ import annotations

import logging


class OneLineRefusal(logging.Filter):
    """A refused request (403: a member opening the finance pages, say) is the permission
    check doing its job, not a fault of the server: ``django.request`` would log it with the
    ``PermissionDenied`` traceback. Keep one line, with the reason the view gave."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", None) != 403 or not record.exc_info:
            return True
        reason = str(record.exc_info[1] or "")
        text = record.getMessage()
        record.msg, record.args = (f"{text} ({reason})" if reason else text), ()
        record.exc_info, record.exc_text = None, None
        return True
