"""What a person stopped by a spending limit can do next, in words: who can raise the limit
(the team's admins, by name), when its period starts again (in the team's time zone), and the
submit's own way around it (``start_when_budget_allows``).

A refusal that only says "over the limit" leaves a member stuck: they cannot raise it, and do
not know who can or when the limit frees itself. So each refusal names the ways out that
apply to the limit that refused:

- a team period (day, week, month) or the per-member month: wait until it starts again (the
  moment, in the team's time zone), ask an admin (by name) to raise it, or submit with "Wait
  for budget" and the job waits in the queue until it fits;
- the job's own limit (``budget_usd``, the submitter's own): give the job a larger one, or none;
- an estimate larger than the whole limit: waiting does not help, so it is not offered.

The budget-paused job's page and banner use the same words (``billing.resume``).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from billing.models import LimitKind
from nomadgpu.humanize import duration
from nomadgpu.team_admins import admin_names

if TYPE_CHECKING:
    from billing.services import LimitStatus

# The submit form's checkbox and the job file's (and API's) key that queue instead of refusing.
WAIT_FIELD = "Wait for budget"
WAIT_KEY = "start_when_budget_allows"
# The job's own limit: the form's field and the spec key.
BUDGET_FIELD = "Budget (USD)"
BUDGET_KEY = "budget_usd"


def starts_again(status: LimitStatus) -> datetime | None:
    """When STATUS's limit starts again from zero: its period's end; None for the job's own
    limit (it covers the job's whole life)."""
    return None if status.kind == LimitKind.JOB else status.period_end


def moment_text(moment: datetime, time_zone: str, *, now: datetime) -> str:
    """ "00:00 on Thu 5 Nov (Europe/Berlin), in 11 h 58 min": the moment as the team reads
    it, and how far off."""
    local = moment.astimezone(ZoneInfo(time_zone))
    left_s = max((moment - now).total_seconds(), 0.0)
    days = int(left_s // 86400)
    left = f"{days} days" if days >= 2 else duration(left_s)
    return f"{local:%H:%M} on {local:%a} {local.day} {local:%b} ({time_zone}), in {left}"


def rollover_text(status: LimitStatus, team, *, now: datetime) -> str:
    """ "the daily limit starts again at 00:00 on Thu 5 Nov (UTC), in 12 h"; "" for a limit
    that does not roll over (the job's own)."""
    moment = starts_again(status)
    if moment is None:
        return ""
    name = f"{LimitKind(status.kind).label} limit"
    return f"the {name} starts again at {moment_text(moment, team.time_zone, now=now)}"


def submit_refusal(status: LimitStatus, estimate_usd: float, team, *, now: datetime) -> str:
    """What a submitter refused by STATUS's limit can do (module docstring), as the sentence
    after the refusal's numbers."""
    if status.kind == LimitKind.JOB:
        return (
            f'What you can do: give the job a larger limit of its own ("{BUDGET_FIELD}" on the '
            f"form, {BUDGET_KEY} in a job file or the API), or none: the team's limits still "
            "apply."
        )
    ask = f"ask a team admin ({admin_names(team)}) to raise it"
    if estimate_usd > float(status.limit_usd):
        return (
            f"The estimate alone is more than the whole {status.label}, so waiting does not "
            f"help. What you can do: {ask}, or make the job smaller."
        )
    return (
        f"What you can do: wait until {rollover_text(status, team, now=now)}; {ask}; or "
        f'submit with "{WAIT_FIELD}" (the form\'s checkbox, or {WAIT_KEY} = true in a job '
        "file or the API) to queue the job until it fits."
    )
