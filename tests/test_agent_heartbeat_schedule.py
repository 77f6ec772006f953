"""The heartbeat thread keeps its schedule on a slow host: each beat is due an interval after
the previous one started, not after it finished (``agent.heartbeat``). Driven by a fake clock:
each supervisor call takes the time the test says, and the test reads what the thread waits."""

from __future__ import annotations

import pytest

from agent import heartbeat
from agent.heartbeat import Heartbeater


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


def run_beats(monkeypatch, call_seconds: list[float], interval_s: float = 1.0):
    """Run the thread's loop in this thread for len(CALL_SECONDS) beats, each call taking its
    seconds on the fake clock; return the beats' start moments and the waits asked for."""
    clock = Clock()
    monkeypatch.setattr(heartbeat, "monotonic", clock.monotonic)
    started: list[float] = []
    waits: list[float] = []

    class Api:
        def call(self, name: str, body: dict) -> dict:
            started.append(clock.now)
            clock.now += call_seconds[len(started) - 1]
            return {"command": "continue", "heartbeat_interval_s": interval_s}

    beater = Heartbeater(
        api=Api(),
        interval_s=interval_s,
        last_seq=0,
        snapshot=dict,
        on_command=lambda command: None,
        on_token_dead=lambda: None,
    )

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        clock.now += seconds
        if len(started) == len(call_seconds):
            beater._stop.set()
        return False

    monkeypatch.setattr(beater._wake, "wait", wait)
    beater._run()
    return started, waits


def test_a_slow_beat_does_not_push_the_next_one_later(monkeypatch):
    started, waits = run_beats(monkeypatch, [0.7, 0.7, 0.2])

    assert started == pytest.approx([100.0, 101.0, 102.0])
    assert waits == pytest.approx([0.3, 0.3, 0.8])


def test_a_beat_longer_than_the_interval_is_followed_at_once_never_with_a_negative_wait(
    monkeypatch,
):
    started, waits = run_beats(monkeypatch, [1.5, 0.1])

    assert started == pytest.approx([100.0, 101.5])
    assert waits == pytest.approx([0.0, 0.9])
