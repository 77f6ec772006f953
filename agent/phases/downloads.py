"""What a phase needs to download from storage, and how often a download is tried.

A phase that downloads (code, stage, restore) takes a Downloads: the storage client, the
counter its bytes are added to (heartbeat ``bytes_down``) and the event that ends its retries
(the token died). It is an argument, not the agent's attribute, so that each phase's bytes can
be counted on their own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import httpx

from agent import checkpoints as ck
from agent.phases.meter import PhaseMeter

log = logging.getLogger("agent")

RESTORE_TRIES = 3
T = TypeVar("T")


@dataclass(frozen=True)
class Downloads:
    storage: httpx.Client
    counter: ck.ByteCounter
    fenced: threading.Event  # the token died: no further try

    def for_phase(self, meter: PhaseMeter, name: str, total: int | None) -> Downloads:
        """These downloads counted for phase NAME too (of TOTAL bytes), which begins now."""
        meter.begin(name, total)
        return replace(self, counter=meter.counter(name, self.counter))

    def retried(self, what: str, fetch: Callable[[], T]) -> T:
        """FETCH, tried RESTORE_TRIES times while it fails with DownloadError."""
        for attempt in range(1, RESTORE_TRIES + 1):
            try:
                return fetch()
            except ck.DownloadError as exc:
                if attempt == RESTORE_TRIES or self.fenced.is_set():
                    raise
                log.warning("%s download failed (%s); retrying", what, exc)
                time.sleep(attempt)
        raise AssertionError("unreachable")
