"""``manage.py sandbox serve|inject|instances ...``: the sandbox marketplace's command line.

A thin wrapper around ``python -m sandbox``, which runs without Django: the arguments go
unparsed to it, and Django only supplies the default state directory, the ``SANDBOX_DIR``
setting, through the variable the sandbox's command line reads (``SANDBOX_DIR``). Nothing here
imports the sandbox: it is another program, a stand-in for Vast.

From the command line (``manage.py sandbox serve``, the Procfile) this process becomes
``python -m sandbox`` (``os.execve``): same process id, so a signal sent to it (honcho's SIGTERM
to the process group, Ctrl-C) reaches the sandbox alone and exactly once, and a SIGKILL leaves
no orphan holding the port. ``call_command("sandbox", ...)`` runs it as a child instead, with
the same standard output and error, and exits with its code when it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run the local Vast.ai-compatible marketplace, or inject a failure into it."

    def run_from_argv(self, argv: list[str]) -> None:
        # argv = [manage.py, "sandbox", ...]: the sandbox's own parser handles the rest.
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, _command(argv[2:]), _environment())  # noqa: S606 - no shell

    def handle(self, *args: Any, **options: Any) -> None:  # call_command("sandbox", "inject", ...)
        code = subprocess.run(_command([str(a) for a in args]), env=_environment()).returncode
        if code:
            sys.exit(code)

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("args", nargs="*")


def _command(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "sandbox", *argv]


def _environment() -> dict[str, str]:
    """This process's environment, the state directory from the settings, and the checkout on
    the module path so ``-m sandbox`` is found from any working directory."""
    path = [str(settings.BASE_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {
        **os.environ,
        "SANDBOX_DIR": str(settings.SANDBOX_DIR),
        "PYTHONPATH": os.pathsep.join(path),
    }
