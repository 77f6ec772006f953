"""The two figures of a recovery, defined once: every surface (job page, member API and CLI,
status page and its JSON, feed and badge, notifications, admin, ``manage.py drill``) shows
what these functions return, with these names.

Both count from **the loss**: the lost host's last heartbeat (``Interruption.last_heartbeat_at``),
or the detection where no heartbeat was ever heard. Why the last heartbeat and not the
detection: the job's last sign of progress is its last heartbeat, and the time the watchdog
took to notice is downtime the team paid for (counting from the detection hid it; counting
from a drill's command hid it too). It overstates by less than one heartbeat interval, where
the detection understated by up to the whole heartbeat timeout. The recovery anatomy
(``jobs.anatomy``) starts at the same moment, so its phases add up to "training again".

- **Back on a machine**: the loss → the replacement running (``Interruption.running_again_at``:
  its agent reported the training command started, the moment the job shows ``running``
  again; dated by the agent's own ``command_started`` phase, as its first step is, else by the
  arrival of the beat that said so, and "training again" is never dated before it). Not the
  provider's ``running``: a container is running at the provider while the agent still
  installs, fetches the code and restores the checkpoint, and one whose start fails never had
  the job on it.
- **Training again**: the loss → the first training step reported after it
  (``Interruption.training_again_at``, the replacement's ``first_step_at``). This is what a
  user waits for, and what the badge shows.

A replacement lost before its first step leaves "training again" open: it closes with the
first step of the next attempt that reaches one (``lifecycle.mark_running`` hands the open
rows to it), so a chain of losses reads as one long recovery, not a short one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from jobs.models import Interruption

BACK_ON_A_MACHINE = "back on a machine"
TRAINING_AGAIN = "training again"


@dataclass(frozen=True)
class RecoveryTimes:
    """One interruption's two figures (seconds from the loss; None while not reached)."""

    lost_at: datetime
    back_on_machine_at: datetime | None
    training_again_at: datetime | None

    @property
    def back_on_machine_s(self) -> float | None:
        return seconds_between(self.lost_at, self.back_on_machine_at)

    @property
    def training_again_s(self) -> float | None:
        return seconds_between(self.lost_at, self.training_again_at)


def lost_at(row: Interruption) -> datetime:
    """The loss: the lost host's last heartbeat, or the detection without one (module
    docstring)."""
    return row.last_heartbeat_at or row.detected_at


def recovery_times(row: Interruption) -> RecoveryTimes:
    """ROW's loss, back on a machine and training again (module docstring)."""
    return RecoveryTimes(
        lost_at=lost_at(row),
        back_on_machine_at=row.running_again_at,
        training_again_at=row.training_again_at,
    )


def seconds_between(start: datetime, end: datetime | None) -> float | None:
    """END - START in seconds, never negative (a detection dated before the last heartbeat);
    None without an END."""
    if end is None:
        return None
    return max((end - start).total_seconds(), 0.0)
