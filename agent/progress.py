"""Training progress as the script reports it through $NOMAD_PROGRESS_FILE."""

from __future__ import annotations

import json
import math
import os
from collections import deque
from pathlib import Path
from typing import Any

SPEED_WINDOW = 20  # reports; long enough to smooth jitter, short enough to see a slow host


class ProgressWatcher:
    """Rereads the progress file when it changes and keeps the step rate."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.step: int | None = None
        self.total_steps: int | None = None
        self.loss: float | None = None
        self._seen: tuple[int, int] | None = None
        self._samples: deque[tuple[float, int]] = deque(maxlen=SPEED_WINDOW)

    def poll(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        if self._seen == (st.st_mtime_ns, st.st_size):
            return
        self._seen = (st.st_mtime_ns, st.st_size)
        try:
            data = json.loads(self.path.read_text())
            step = int(data["step"])
        except (OSError, ValueError, KeyError, TypeError):
            return  # half-written by a script that does not rename; the next poll sees it whole
        self._record(step, data, st.st_mtime)

    def _record(self, step: int, data: dict[str, Any], mtime: float) -> None:
        if self.step is not None and step < self.step:
            self._samples.clear()  # the script went back (restarted from a checkpoint)
        self.step = step
        total = data.get("total_steps")
        self.total_steps = int(total) if isinstance(total, (int, float)) else self.total_steps
        loss = data.get("loss")
        finite = isinstance(loss, (int, float)) and math.isfinite(loss)
        self.loss = float(loss) if finite else None
        when = data.get("time")
        when = float(when) if isinstance(when, (int, float)) else mtime
        if not self._samples or self._samples[-1][1] != step:
            self._samples.append((when, step))

    @property
    def seconds_per_step(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        if s1 <= s0 or t1 <= t0:
            return None
        return round((t1 - t0) / (s1 - s0), 4)
