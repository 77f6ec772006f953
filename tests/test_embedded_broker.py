"""The embedded filesystem broker never hands a consumer half a message.

kombu's own filesystem transport creates a message file before writing it; with producers in
other processes (beat, the web process) a consumer read some of them empty (14 of 200 in a run
of this very test against kombu's class) and the worker died. ``nomadgpu.broker`` fixes that.
"""

from __future__ import annotations

import multiprocessing
from queue import Empty

from kombu import Connection

MESSAGES, PRODUCERS, SIZE = 100, 2, 1 << 20


def produce(folder: str) -> None:
    from nomadgpu import broker

    broker.register()  # a fresh process, as beat or the web process would be
    options = {"data_folder_in": folder, "data_folder_out": folder}
    with Connection("filesystem://", transport_options=options) as conn:
        channel = conn.channel()
        for n in range(MESSAGES):
            channel._put("q", {"n": n, "body": "x" * SIZE})


def test_messages_from_other_processes_are_never_read_half_written(tmp_path):
    options = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path)}
    context = multiprocessing.get_context("spawn")
    producers = [context.Process(target=produce, args=(str(tmp_path),)) for _ in range(PRODUCERS)]
    received = []

    with Connection("filesystem://", transport_options=options) as conn:
        assert type(conn.transport).__module__ == "nomadgpu.broker"
        consumer = conn.channel()
        for process in producers:
            process.start()
        while len(received) < MESSAGES * PRODUCERS:
            try:
                received.append(consumer._get("q"))
            except Empty:
                continue
    for process in producers:
        process.join(timeout=60)

    assert all(len(message["body"]) == SIZE for message in received)
