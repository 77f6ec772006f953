"""Start deadlines from bytes and the link: how long a host may take to come up (and, in
``phase_stall``, how long an early phase of its agent may go without a byte). Plain values in,
so the watchdog, the provider poll, the heartbeat and a bench ask the same question.

**Before the agent exists** (``start_due``, then ``pushed_start_due`` at each provider poll that
brings news): the host is due to have an agent by

    rent + Vast's start + the image pull (unless the machine holds the image) + the agent's start

each term below with its source. The pull is the image's bytes (``RentDecision.image_gb``, GiB)
at the link the team's agents measured on that machine, else the offer's advertised
``inet_down``, times a margin: 1.5 on a measured link (its own spread), 3 on an advertised one
(a host's pulls run well under the figure it advertises: noema's shootout saw a 30 GB image
take 9-32 min on cold Community hosts, 125-444 Mbit/s). A machine that more likely than not
still holds the image (``image_cached_chance`` ≥ 0.5, from the team's pulls,
``jobs.renting.image_cache``) is given no pull. The user's ``start_timeout_s`` is the outer cap:
whichever comes first.

What Vast shows is progress, and pushes the deadline later, never earlier (``pushed_start_due``):
- ``loading`` first seen: the pull starts now (unless the image is held), then the container's
  start and the agent's;
- ``running`` first seen: the agent's start from now;
- a ``status_msg`` that changed from one Docker pull line to another ("Downloading",
  "Extracting", "Pull complete", ...; not "Retrying in 5 seconds"): ``PULL_QUIET_S`` more from
  now (the first pull line after none is the pull starting, not bytes moving); on a machine
  taken to hold the image, a pull line at all means it did not, and the whole pull is allowed
  from then.
A status that does not change pushes nothing: a pull that hangs keeps the deadline it had.

**After register** the early phases' bytes are judged by ``phase_stall``, at the same link and
margins (``Link``), with the same words.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

GIB = 1024**3  # the unit image sizes are priced in (hosts.selection.BYTES_PER_GB)
BITS_PER_MBIT = 1_000_000

# Vast's own start, besides the pull: its docs give scheduling "2-5 minutes (not counting Docker
# image pull time)" (vast-ai/docs, manage-instances and quickstart pages) and call `loading`
# "normal for 30 seconds with cached images" (the FAQ); measured, one RTX 4090 went from
# create to `running` in 72.8 s (dumont-cloud's integration test, 2026-01), another tool sees
# `running` 30-60 s after create (stationthis research notes), and noema's good rentals had SSH
# at 75-167 s (monygroupcorp/noema docs/benchmarks/2026-05-04-vastai-rebaseline.md). The top of
# Vast's documented range, 1.8 times the slowest good rental noema saw: a host inside what Vast
# calls normal is never abandoned. Settings: START_PROVISION_S.
VAST_START_S = 300.0
# `loading` with the image on the host (the container's own start): Vast's FAQ, above.
CONTAINER_START_S = 30.0
# The agent's start once the container runs: our bootstrap installs httpx and cryptography when
# the image lacks them, fetches agent.pyz from the portal and registers (a few seconds on the
# sandbox; a slow package mirror can take tens). Settings: START_BOOTSTRAP_S.
AGENT_START_S = 60.0
MEASURED_MARGIN = 1.5
ADVERTISED_MARGIN = 3.0
CACHED_AT = 0.5  # the chance at which a machine is taken to hold the image
# A pull whose Vast message stopped changing for this long is not moving: Docker rewrites its
# progress line continuously while a layer downloads or extracts (gunzip runs at tens of MB/s,
# so a several-GB layer still prints progress every second), and the poll reads it every 10 s.
PULL_QUIET_S = 120.0

# Docker's pull progress words (`docker pull` prints one line per layer); an error retry
# ("Retrying in 5 seconds") is not progress.
_PULL_MOVING = re.compile(
    r"Pulling fs layer|Downloading|Verifying Checksum|Download complete|Extracting|"
    r"Pull complete|Already exists|Pulling from|Digest: sha256|Downloaded newer image",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Link:
    """A host's download link: Mbit/s (None: unknown) and where the figure comes from."""

    mbps: float | None
    source: str = ""  # "measured" or "advertised"

    @property
    def margin(self) -> float:
        return MEASURED_MARGIN if self.source == "measured" else ADVERTISED_MARGIN

    def seconds(self, nbytes: float) -> float:
        """Seconds to move NBYTES at this link, times its margin (0 when the link is unknown)."""
        if not self.mbps or nbytes <= 0:
            return 0.0
        return nbytes * 8 / (self.mbps * BITS_PER_MBIT) * self.margin

    @property
    def words(self) -> str:
        return f"{_mbps(self.mbps)} Mbit/s {self.source}" if self.mbps else "an unknown link"


def link_for(measured_mbps: float | None, advertised_mbps: float | None) -> Link:
    """The link to plan with: what was measured, else what the offer advertised."""
    if positive(measured_mbps):
        return Link(float(measured_mbps), "measured")  # type: ignore[arg-type]
    if positive(advertised_mbps):
        return Link(float(advertised_mbps), "advertised")  # type: ignore[arg-type]
    return Link(None)


@dataclass(frozen=True)
class Allowances:
    """The fixed parts of a start (seconds): Vast's start besides the pull, the container's
    start in ``loading``, the agent's start once ``running`` (settings can scale them: the
    sandbox compresses Vast's minutes)."""

    vast_start_s: float = VAST_START_S
    container_start_s: float = CONTAINER_START_S
    agent_start_s: float = AGENT_START_S


@dataclass(frozen=True)
class Due:
    """A deadline (AT) and why, in words for a person: what it allows for, without "due in"
    (the page counts that from its own now). CAPPED: the user's ``start_timeout_s`` set it."""

    at: datetime
    why: str
    capped: bool = False


# ---- before the agent --------------------------------------------------------------------


@dataclass(frozen=True)
class StartPlan:
    """What a host's start is judged on: the image's size (GiB), whether the machine is taken
    to hold it, the link, the fixed allowances and the user's cap."""

    rented_at: datetime
    image_gb: float
    image_held: bool
    link: Link
    start_timeout_s: float
    allowances: Allowances = Allowances()

    @property
    def pull_s(self) -> float:
        """The whole image at the link, with its margin."""
        return self.link.seconds(self.image_gb * GIB)

    @property
    def pull_words(self) -> str:
        if self.image_gb <= 0:
            return "no image size known"
        return f"pull of {_gb(self.image_gb)} at {self.link.words}: {seconds_text(self.pull_s)}"

    def capped(self, at: datetime, why: str) -> Due:
        """AT, or the rent plus the cap when that comes first."""
        cap = self.rented_at + timedelta(seconds=self.start_timeout_s)
        if cap > at:
            return Due(at, why)
        words = f"the job's start timeout ({seconds_text(self.start_timeout_s)})"
        if why:  # what the bytes would have allowed, so that a person can raise the cap
            words += f", under {why} = {seconds_text((at - self.rented_at).total_seconds())}"
        return Due(cap, words, True)


def start_due(plan: StartPlan) -> Due:
    """When a host rented as PLAN says must have its agent (module docstring, before the agent)."""
    a = plan.allowances
    if not plan.image_held and plan.image_gb > 0 and not plan.link.mbps:
        # No link to time the pull by (an instance adopted by its label has no offer): only
        # the user's cap is known never to come before a pull that is going well.
        return plan.capped(plan.rented_at + timedelta(seconds=plan.start_timeout_s), "")
    parts = [f"Vast's start ≤ {seconds_text(a.vast_start_s)}"]
    seconds = a.vast_start_s + a.agent_start_s
    if plan.image_held:
        parts.insert(0, "image on the machine")
    else:
        parts.append(plan.pull_words)
        seconds += plan.pull_s
    parts.append(f"agent start {seconds_text(a.agent_start_s)}")
    return plan.capped(plan.rented_at + timedelta(seconds=seconds), " + ".join(parts))


@dataclass(frozen=True)
class ProviderNews:
    """What the provider poll saw of a host before its agent: the status and message of the
    poll before (BEFORE_*) and of this one (NOW_*), and whether a pull was seen on a machine
    taken to hold the image (PULL_SEEN)."""

    before_status: str
    before_msg: str
    now_status: str
    now_msg: str
    pull_seen: bool = False

    @property
    def pull_moving(self) -> bool:
        """The pull's message changed from one progress line to another: bytes are moving. (The
        first such line after none is the pull starting, not movement.)"""
        return (
            self.now_msg != self.before_msg
            and is_pull_line(self.now_msg)
            and is_pull_line(self.before_msg)
        )

    @property
    def pull_started(self) -> bool:
        """A pull's progress line where there was none."""
        return is_pull_line(self.now_msg) and not is_pull_line(self.before_msg)


def is_pull_line(msg: str) -> bool:
    """Whether MSG reads as a Docker pull going on."""
    return bool(_PULL_MOVING.search(msg or ""))


def pushed_start_due(plan: StartPlan, due: Due, news: ProviderNews, *, now: datetime) -> Due | None:
    """DUE pushed by NEWS (module docstring), or None when the news pushes nothing later."""
    candidates = _pushes(plan, news, now=now)
    if not candidates:
        return None
    best = max(candidates, key=lambda d: d.at)
    pushed = plan.capped(best.at, best.why)
    return pushed if pushed.at > due.at else None


def _pushes(plan: StartPlan, news: ProviderNews, *, now: datetime) -> list[Due]:
    a, found = plan.allowances, []
    held = plan.image_held and not news.pull_seen
    changed = news.now_status != news.before_status
    clock = f"{news.now_status} seen"
    if changed and news.now_status == "loading":
        pull = 0.0 if held else plan.pull_s
        what = "image on the machine" if held else plan.pull_words
        seconds = pull + a.container_start_s + a.agent_start_s
        why = f"{clock}: {what} + container start {seconds_text(a.container_start_s)}"
        found.append(Due(now + timedelta(seconds=seconds), f"{why} + agent start"))
    if changed and news.now_status == "running":
        found.append(Due(now + timedelta(seconds=a.agent_start_s), f"{clock}: agent start"))
    tail, said = a.container_start_s + a.agent_start_s, _quote(news.now_msg)
    if held and news.pull_started:  # the machine did not hold it after all: the whole pull
        why = f"pulling after all ({said}): {plan.pull_words} + starts"
        found.append(Due(now + timedelta(seconds=plan.pull_s + tail), why))
    if news.now_status == "loading" and news.pull_moving:
        why = f"pull moving ({said}): {seconds_text(PULL_QUIET_S)} without news + starts"
        found.append(Due(now + timedelta(seconds=PULL_QUIET_S + tail), why))
    return found


def pull_seen_on_held_image(plan: StartPlan, news: ProviderNews) -> bool:
    """Whether NEWS shows a pull on a machine PLAN took to hold the image (remembered: the
    whole pull is allowed once, from that moment)."""
    return news.pull_seen or (plan.image_held and is_pull_line(news.now_msg))


def overdue_detail(due: Due, *, rented_at: datetime, provider_status: str, now: datetime) -> str:
    """Why a host without an agent is abandoned: "not running 212 s after rent: <why>, due by
    180 s" (or "running but no agent" when Vast says it runs)."""
    elapsed = seconds_text((now - rented_at).total_seconds())
    state = "running but no agent" if provider_status == "running" else "not running"
    by = seconds_text((due.at - rented_at).total_seconds())
    return f"{state} {elapsed} after rent: {due.why}, due by {by}"


# ---- words ---------------------------------------------------------------------------------


def positive(value: object) -> bool:
    """A finite number above 0 (not a bool)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def seconds_text(seconds: float) -> str:
    return f"{max(seconds, 0):.0f} s"


def _mbps(mbps: float | None) -> str:
    return f"{mbps:,.0f}" if mbps and mbps >= 10 else f"{mbps or 0:.1f}"


def _gb(gb: float) -> str:
    return f"{gb:.1f} GB"


def bytes_text(nbytes: float) -> str:
    if nbytes >= GIB:
        return f"{nbytes / GIB:.1f} GB"
    return f"{nbytes / 1024**2:,.0f} MB"


def _quote(msg: str) -> str:
    text = " ".join((msg or "").split())
    return f"“{text[:60]}{'…' if len(text) > 60 else ''}”"
