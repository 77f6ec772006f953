#!/usr/bin/env python3
"""Hold every core busy until told to stop: one spinning process per core (``os.cpu_count()``).

`make test-stress` (bin/test-stress) runs the tests that start processes beside it, so that
heartbeats, watchdog passes and process starts are late the way a loaded host makes them late.
SIGTERM or SIGINT stops it and its spinners; a spinner whose parent is gone stops by itself,
so a killed run never leaves cores spinning.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys


def spin(parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    while True:
        for _ in range(2_000_000):
            pass
        if os.getppid() != parent:  # the hog died without stopping us (SIGKILL)
            return


def main() -> int:
    spinners = [
        multiprocessing.Process(target=spin, args=(os.getpid(),), daemon=True)
        for _ in range(os.cpu_count() or 1)
    ]
    for spinner in spinners:
        spinner.start()

    def stop(signum, frame) -> None:
        for spinner in spinners:
            spinner.terminate()
        for spinner in spinners:
            spinner.join()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
