"""The heartbeat thread: sends the agent's state every interval and hands back commands.

A heartbeat is a snapshot, not an event, so a failed one is never replayed: the next one (with
a higher seq) carries the newer state. While the supervisor is unreachable the thread retries
sooner than the interval (1, 2, 4 ... s, never slower than the interval) so that the supervisor
hears from us as soon as it is back. Training is never touched because of it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from time import monotonic
from typing import Any

from agent.client import Backoff, BadPayload, Refused, SupervisorClient, TokenDead, Unavailable

log = logging.getLogger("agent.heartbeat")

COMMANDS = {"continue", "checkpoint_now", "stop"}


def clamp_interval(value: object, default: float) -> float:
    try:
        return min(600.0, max(0.1, float(value)))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default


class Heartbeater:
    def __init__(
        self,
        *,
        api: SupervisorClient,
        interval_s: float,
        last_seq: int,
        snapshot: Callable[[], dict[str, Any]],
        on_command: Callable[[str], None],
        on_token_dead: Callable[[], None],
        on_delivered: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.api = api
        self.interval_s = interval_s
        self.seq = last_seq
        self.snapshot = snapshot
        self.on_command = on_command
        self.on_token_dead = on_token_dead
        self.on_delivered = on_delivered  # told each body the supervisor answered
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._sending = threading.Lock()  # one heartbeat at a time, seq strictly increasing
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Send the next heartbeat now (the phase changed)."""
        self._wake.set()

    def send_final(self) -> None:
        """One last heartbeat from the caller's thread, so the final step and phase arrive
        before the exit report. Failures are only logged: the exit report follows anyway."""
        try:
            self._beat()
        except TokenDead:
            self.on_token_dead()
        except (Unavailable, Refused, BadPayload) as exc:
            log.warning("final heartbeat not delivered: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        backoff = Backoff(initial_s=1.0, cap_s=self.interval_s)
        while not self._stop.is_set():
            # The next beat is due an interval after this one STARTS: the supervisor's
            # deadline counts from each beat's arrival, and a beat that took a second on a
            # loaded host must not push every later one a second further behind.
            started = monotonic()
            delay = self.interval_s
            try:
                self._beat()
                backoff.reset()
            except TokenDead as exc:
                log.error("supervisor ended this attempt (%s)", exc)
                self.on_token_dead()
                return
            except Unavailable as exc:
                backoff.cap_s = self.interval_s
                delay = min(self.interval_s, backoff.next_delay())
                log.warning("heartbeat %d not delivered (%s); next in %.1fs", self.seq, exc, delay)
            except (Refused, BadPayload) as exc:
                log.error("heartbeat %d rejected: %s", self.seq, exc)
            self._wake.wait(max(0.0, started + delay - monotonic()))
            self._wake.clear()

    def _beat(self) -> None:
        with self._sending:
            self.seq += 1
            body = {"seq": self.seq, **self.snapshot()}
            reply = self.api.call("heartbeat", body)
            if self.on_delivered is not None:  # before the next beat takes its snapshot
                self.on_delivered(body)
        self.interval_s = clamp_interval(reply.get("heartbeat_interval_s"), self.interval_s)
        command = reply.get("command") or "continue"
        if command not in COMMANDS:
            log.error("unknown command %r from the supervisor; ignoring it", command)
        elif command != "continue":
            log.info("supervisor says: %s", command)
            self.on_command(command)
