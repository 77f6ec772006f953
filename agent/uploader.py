"""The background thread that ships ready checkpoints, one at a time, newest first (older
pending ones are dropped when uploads fall behind)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from agent import checkpoints as ck
from agent.client import (
    BadPayload,
    Refused,
    SupervisorClient,
    TokenDead,
    call_until_answered,
)

log = logging.getLogger("agent.uploader")

SCAN_EVERY_S = 1.0
FULL_TRIES = 3  # a checkpoint gets fresh URLs this many times before it is given up


class Uploader:
    def __init__(
        self,
        *,
        api: SupervisorClient,
        storage: httpx.Client,
        checkpoint_dir: Path,
        data_key: bytes | None,
        counter: ck.ByteCounter,
        fenced: threading.Event,
        on_token_dead: Callable[[], None],
    ) -> None:
        self.api = api
        self.storage = storage
        self.checkpoint_dir = checkpoint_dir
        self.data_key = data_key
        self.counter = counter
        self.fenced = fenced
        self.on_token_dead = on_token_dead
        self.busy = False  # read by heartbeats: phase "uploading"
        self.uploaded: list[int] = []
        self._handled: set[tuple[str, int]] = set()
        self._bad_markers: set[Path] = set()
        self._finishing = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="uploader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self, timeout: float | None = None) -> bool:
        """Upload whatever is ready now, then stop. False if still busy after TIMEOUT."""
        self._finishing.set()
        self._wake.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self.fenced.is_set():
            finishing = self._finishing.is_set()  # read before the scan: nothing is missed
            newest = self._newest_pending()
            if newest is not None:
                self._ship(newest)
                continue  # more may have become ready during the upload: scan again
            if finishing:
                return
            self._wake.wait(SCAN_EVERY_S)
            self._wake.clear()

    def _newest_pending(self) -> ck.ReadyCheckpoint | None:
        """The newest ready checkpoint not shipped yet. Older pending ones are dropped: when
        uploads fall behind training, shipping a superseded checkpoint only delays the one a
        resume would use."""
        pending = self._pending()
        if not pending:
            return None
        newest = max(pending, key=lambda ready: ready.step)
        for stale in pending:
            if stale is not newest:
                log.info(
                    "checkpoint step %d superseded by %d; not uploading it", stale.step, newest.step
                )
                self._handled.add((stale.path.name, stale.step))
        return newest

    def _pending(self) -> list[ck.ReadyCheckpoint]:
        found = ck.find_ready(self.checkpoint_dir, on_bad_marker=self._bad_marker)
        return [r for r in found if (r.path.name, r.step) not in self._handled]

    def _bad_marker(self, marker: Path, text: str) -> None:
        if marker not in self._bad_markers:
            self._bad_markers.add(marker)
            log.error("ignoring %s: it must hold a step number, not %r", marker, text[:40])

    def _ship(self, ready: ck.ReadyCheckpoint) -> None:
        self.busy = True
        try:
            for attempt in range(1, FULL_TRIES + 1):
                if self._try_ship(ready, last_try=attempt == FULL_TRIES):
                    break
        except TokenDead as exc:
            log.error("supervisor ended this attempt (%s); not uploading anything more", exc)
            self.on_token_dead()
        except ck.Cancelled:
            pass
        except Exception:  # a bug or a malformed reply must not end uploads for good
            log.exception("checkpoint step %d failed unexpectedly", ready.step)
        finally:
            self.busy = False
            self._handled.add((ready.path.name, ready.step))

    def _try_ship(self, ready: ck.ReadyCheckpoint, *, last_try: bool) -> bool:
        """One full try: targets, upload, complete. True when done (or hopeless)."""
        try:
            self._upload_once(ready)
            return True
        except (Refused, BadPayload) as exc:
            log.error("checkpoint step %d refused by the supervisor: %s", ready.step, exc)
        except (KeyError, TypeError) as exc:
            log.error("checkpoint step %d: malformed supervisor reply (%r)", ready.step, exc)
        except ck.CheckpointChanged as exc:
            log.error(
                "checkpoint step %d skipped: %s (do not touch it once ready)", ready.step, exc
            )
        except (ck.StorageError, OSError) as exc:
            if not last_try:
                log.warning("checkpoint step %d upload failed (%s); trying again", ready.step, exc)
                return False
            log.error("checkpoint step %d given up: %s", ready.step, exc)
        return True

    def _upload_once(self, ready: ck.ReadyCheckpoint) -> None:
        plan = ck.plan_tar(ready.path)
        crypt = ck.new_crypt(self.data_key) if self.data_key is not None else None
        size = ck.object_size(plan, crypt is not None)
        log.info("uploading checkpoint step %d (%d bytes)", ready.step, size)
        body = {"step": ready.step, "size": size, "encrypted": crypt is not None}
        reply = self._call("checkpoints", body)
        uploaded = ck.upload_object(
            self.storage,
            reply["upload"],
            size,
            lambda: ck.object_pieces(plan, crypt),
            cancel=self.fenced,
            counter=self.counter,
        )
        done: dict[str, Any] = {"size": size, "sha256": uploaded.sha256}
        if uploaded.parts is not None:
            done["parts"] = uploaded.parts
        self._call(f"checkpoints/{reply['checkpoint_id']}/complete", done)
        ck.mark_uploaded(ready, str(reply["checkpoint_id"]))
        self.uploaded.append(ready.step)
        log.info("checkpoint step %d uploaded (sha256 %s)", ready.step, uploaded.sha256[:12])

    def _call(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        reply = call_until_answered(self.api, name, body, stop=self.fenced)
        if reply is None:
            raise ck.Cancelled()
        return reply
