"""A stand-in for torchrun in the agent's tests: it runs ARGV as a "rank" in a session of its
own, as torchrun starts each rank, and exits with its status.

    python session_launcher.py [--leave] ARGV...

``--leave`` exits at once instead, leaving the rank running (its output to /dev/null, so that
the agent's pipe closing cannot end it): a launcher that died (SIGKILL, a crash) and left its
ranks behind.
"""

from __future__ import annotations

import subprocess
import sys

if __name__ == "__main__":
    leave = sys.argv[1] == "--leave"
    argv, out = (sys.argv[2:], subprocess.DEVNULL) if leave else (sys.argv[1:], None)
    rank = subprocess.Popen(argv, start_new_session=True, stdout=out, stderr=out)
    print(f"rank 0 is pid {rank.pid}", flush=True)
    sys.exit(0 if leave else rank.wait())
