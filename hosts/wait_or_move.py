"""Wait for a host that went offline, or move the job: the decision, on plain numbers.

A Vast instance survives its host's reboot with its disk: the host shows ``offline`` (Vast
computes that status while the host daemon is disconnected) and, when it reconnects, the
instance's own status is shown again and its container restarts with the image, the job's
code, its setup and its local checkpoints still on disk (Vast's ``instance_online`` webhook,
vast-ai/docs ``webhooks``; a host cannot delete a renter's instance, as Vast's own staff say in
cloud-gpus/cloud-gpus.github.io PR #13). While offline nothing is billed but traffic
(docs/vast-api.md §7: no GPU and no storage charge for that period).

So waiting costs time, not money, until the host is back; moving costs a whole start-up on
another machine (rent, image pull, model download, checkpoint restore, container start). Both
sides are priced in dollars with the hours until training again valued at the job's own GPU
$/h (an hour of this job not training is worth at least what an hour of it costs): the
cheaper side wins. Waiting has a deadline (the cap): past it, the job moves.

The return time is modelled as exponential with mean ``mean_s``, reached with probability
``p`` (some hosts never come back), both from the machine's own offline episodes in our
attempts blended with a prior (``ReturnHistory``). The exponential is memoryless, so after
``t`` seconds offline the mean of what is left stays the same while ``p`` falls (Bayes on "not
back yet"): each poll decides again with the odds as they now stand, and a host that stays
away loses the decision before the cap when its odds fall far enough.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SECONDS_PER_HOUR = 3600.0
# The prior, until a machine's own history says otherwise. Not found published (Vast gives no
# figure for how often or how fast hosts come back): a community host that drops off comes
# back about half the time (a reboot, a router, a driver update), in about 5 minutes when it
# does. The sandbox's seeded return times are drawn from the same numbers
# (``sandbox.timing.Timing.host_return_s``).
PRIOR_RETURN_P = 0.5
PRIOR_RETURN_MEAN_S = 300.0
PRIOR_EPISODES = 2.0  # how many offline episodes the prior weighs against what was seen
# Below this chance that the machine comes back at all (given how long it has been away),
# waiting is not worth the odds whatever the prices say. (The chance within the deadline is
# weighed by the prices: it shrinks with the window left, however likely the machine is.)
MIN_RETURN_P = 0.1


@dataclass(frozen=True)
class ReturnHistory:
    """A machine's offline episodes in our attempts: RETURNS came back after RETURN_S seconds
    in all; NEVER were waited on and did not come back before the job moved."""

    returns: int = 0
    return_s: float = 0.0
    never: int = 0

    @property
    def probability(self) -> float:
        """The chance the machine comes back at all, blended with the prior."""
        seen = self.returns + self.never
        return (self.returns + PRIOR_RETURN_P * PRIOR_EPISODES) / (seen + PRIOR_EPISODES)

    @property
    def mean_s(self) -> float:
        """Mean seconds offline when it does come back, blended with the prior."""
        total = self.return_s + PRIOR_RETURN_MEAN_S * PRIOR_EPISODES
        return max(total / (self.returns + PRIOR_EPISODES), 1.0)

    @property
    def source(self) -> str:
        """Where the odds came from, as the job page says it."""
        seen = self.returns + self.never
        if not seen:
            return "the prior: no offline history of this machine yet"
        return f"this machine came back {self.returns} of {seen} times, weighed with the prior"


@dataclass(frozen=True)
class WaitOrMove:
    """The choice for a host that is offline, with its numbers (hours, dollars)."""

    wait: bool
    wait_usd: float  # expected: billed dollars plus the hours until training again at $/h
    move_usd: float
    wait_h: float
    move_h: float
    return_p: float  # chance it is back before the deadline
    expected_return_s: float  # mean seconds until back, given it is back before the deadline
    deadline_s: float  # seconds of waiting left
    source: str = ""

    @property
    def why(self) -> str:
        """One line for the job's timeline, as the outbid choice reads."""
        if self.deadline_s <= 0:
            verb = "move: the deadline for waiting passed"
        elif self.wait:
            verb = f"wait up to {self.deadline_s:.0f} s for it"
        else:
            verb = "move"
        back = (
            f"{self.return_p:.0%} chance it is back within {max(self.deadline_s, 0):.0f} s "
            f"(in {self.expected_return_s:.0f} s expected; {self.source})"
        )
        return (
            f"{verb}: waiting ${self.wait_usd:.3f} ({self.wait_h * 60:.1f} min) vs moving "
            f"${self.move_usd:.3f} ({self.move_h * 60:.1f} min) expected; {back}"
        )

    def as_dict(self) -> dict:
        """JSON-ready, for the event's data."""
        return {
            "wait": self.wait,
            "wait_usd": round(self.wait_usd, 4),
            "move_usd": round(self.move_usd, 4),
            "wait_h": round(self.wait_h, 4),
            "move_h": round(self.move_h, 4),
            "return_p": round(self.return_p, 3),
            "expected_return_s": round(self.expected_return_s, 1),
            "deadline_s": round(self.deadline_s, 1),
        }


def odds_after(p: float, mean_s: float, offline_s: float) -> float:
    """The chance the machine comes back at all, given it is still away after OFFLINE_S."""
    still = p * math.exp(-max(offline_s, 0.0) / mean_s)
    return still / (still + 1.0 - p) if still + 1.0 - p > 0 else 0.0


def back_within(mean_s: float, window_s: float) -> tuple[float, float]:
    """(chance an exponential return of mean MEAN_S falls within WINDOW_S, its mean given it
    does): the truncated exponential."""
    if window_s <= 0:
        return 0.0, 0.0
    tail = math.exp(-window_s / mean_s)
    inside = 1.0 - tail
    return inside, mean_s - window_s * tail / inside


def wait_or_move(
    *,
    offline_s: float,
    cap_s: float,
    history: ReturnHistory,
    restart_h: float,
    restart_usd: float,
    move_h: float,
    move_usd: float,
    usd_per_hour: float,
) -> WaitOrMove:
    """Whether a job whose host has been offline for OFFLINE_S should wait for it (until CAP_S
    offline in all) or move now.

    Waiting, the host is back within the deadline with probability q, after the truncated
    mean, and the container restarts on the same disk (RESTART_H, RESTART_USD: no pull, no
    download, the checkpoint is local); otherwise the whole deadline is waited and the job
    moves anyway. Moving costs MOVE_H hours and MOVE_USD billed: a new rent's start-up on the
    best other offer (detection is done either way). Both are summed as billed dollars plus
    their hours at USD_PER_HOUR. The work since the newest checkpoint is redone either way,
    so it is left out of both. Past the deadline, or when the chance it comes back at all
    falls under ``MIN_RETURN_P``, the job moves.
    """
    window_s = cap_s - offline_s
    p = odds_after(history.probability, history.mean_s, offline_s)
    inside, mean_back_s = back_within(history.mean_s, window_s)
    q = p * inside
    back_h = mean_back_s / SECONDS_PER_HOUR + restart_h
    gave_up_h = max(window_s, 0.0) / SECONDS_PER_HOUR + move_h
    wait_h = q * back_h + (1.0 - q) * gave_up_h
    wait_usd = q * restart_usd + (1.0 - q) * move_usd + wait_h * usd_per_hour
    move_total = move_usd + move_h * usd_per_hour
    wait = window_s > 0 and p >= MIN_RETURN_P and wait_usd < move_total
    return WaitOrMove(
        wait=wait,
        wait_usd=wait_usd,
        move_usd=move_total,
        wait_h=wait_h,
        move_h=move_h,
        return_p=q,
        expected_return_s=mean_back_s,
        deadline_s=window_s,
        source=history.source,
    )
