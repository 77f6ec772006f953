"""``python -m nomadgpu_cli``: the same as the ``nomadgpu`` console script."""

from __future__ import annotations

import sys

from nomadgpu_cli.cli import main

sys.exit(main())
