"""``python -m hosts.sandbox serve|inject|instances ...`` — no Django needed."""

from __future__ import annotations

import sys

from hosts.sandbox.cli import main

sys.exit(main())
