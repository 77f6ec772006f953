"""``manage.py sandbox serve|inject|instances ...``: the sandbox marketplace's command line.

A thin wrapper: the arguments go unparsed to ``sandbox.cli.main``, which also runs without
Django (``python -m sandbox``). Django only supplies the default state directory, the
``SANDBOX_DIR`` setting.
"""

from __future__ import annotations

import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run the local Vast.ai-compatible marketplace, or inject a failure into it."

    def run_from_argv(self, argv: list[str]) -> None:
        # argv = [manage.py, "sandbox", ...]: the sandbox's own parser handles the rest.
        sys.exit(self._main(argv[2:]))

    def handle(self, *args: Any, **options: Any) -> None:  # call_command("sandbox", "inject", ...)
        code = self._main([str(a) for a in args])
        if code:
            sys.exit(code)

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("args", nargs="*")

    def _main(self, argv: list[str]) -> int:
        from sandbox.cli import main

        return main(argv, default_state_dir=settings.SANDBOX_DIR)
