"""One rental of the acquisition bench, played out on the sandbox's market weather: when its
agent registers, when it fails and when the product's watchdog would know, and what it billed.

The truth of a rental is the sandbox's own model, imported, not restated: the machine's hidden
traits (``sandbox.weather.machine_traits``), the rental's fate (``rental_fate``) and how a
start goes on them (``sandbox.first_attempts.start_outcome``: the image pull at the machine's
real link, a loss while loading or downloading, a never-ready host). The bench sits outside the
import contracts (``.importlinter`` lists the apps, not ``bench``), and ``bench/estimates.py``
already reads ``sandbox.timing``. Times are production seconds from the create.

When a failure is *known* is the product's rule, also imported: a host lost while loading or
after its register is seen by the next provider poll (``PROVIDER_POLL_INTERVAL_S``, 10 s); a
host that never gets its agent up is given up at its start deadline, either today's flat
``start_timeout_s`` (1,200 s) or the deadline from bytes (``jobs.watchdog.start_deadline``:
``start_due`` at the rent, ``pushed_start_due`` at each poll, with the status and the Docker
progress line Vast would show). The deadline from bytes can also give up a healthy host that is
slower than it allows: that is counted as a failed attempt, as it would be.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hosts.vast import Offer
from jobs.watchdog import start_deadline as sd
from sandbox.first_attempts import Start, start_outcome
from sandbox.timing import IMAGE_BYTES
from sandbox.weather import Fate, Traits, down_bytes_per_s

POLL_S = 10.0  # PROVIDER_POLL_INTERVAL_S
FLAT_TIMEOUT_S = 1200.0  # JobSpec.start_timeout_s's default: today's only start deadline
DESTROY_S = 2.0  # a destroy call to Vast's API (no public figure; seconds)
REGISTER_S = 15.0  # the agent's bootstrap and register (hosts.selection.race.REGISTER_S)
DISK_GB = 20.0  # the field report's requirements (tests/support/market.py)


@dataclass(frozen=True)
class JobShape:
    """What a job does on a fresh host before its first step, and then (production s)."""

    name: str
    gpu: str
    image_b: int
    model_b: float  # downloaded by the command after setup
    setup_s: float
    load_s: float
    step_s: float
    steps: int

    @property
    def start(self) -> Start:
        """``sandbox.first_attempts``'s view of it: survives to its first step."""
        return Start(
            image_bytes=self.image_b,
            download_bytes=int(self.model_b),
            setup_minutes=(REGISTER_S + self.setup_s) / 60,  # running, before the download
            first_minutes=(self.load_s + self.step_s) / 60,
        )


# The field report's QLoRA job (bench/support/field_report.py): the sandbox's pytorch image
# (3.6 GB), a 15 GB model downloaded by the command, 45 s of setup, 30 s to load, 4 s a step.
FIELD = JobShape("field report", "RTX 4090", IMAGE_BYTES["pytorch/pytorch"], 15e9, 45, 30, 4, 300)
# noema's re-baseline start (sandbox/first_attempts.py REFERENCE_START, what the weather is
# calibrated on): 33 GB of models after about 3 minutes of setup, on RTX 3090s; its first
# "step" is the download done; then the field report's 300 x 4 s of work.
NOEMA = JobShape("noema", "RTX 3090", IMAGE_BYTES["pytorch/pytorch"], 33e9, 180, 0, 4, 300)
SHAPES = {"field": FIELD, "noema": NOEMA}
EPOCH = datetime(2026, 12, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Played:
    """One rental from its create (production s): REGISTERED_S (None: never), FIRST_STEP_S
    (None: it failed), FAILED_IN ('' or the sandbox's words, or 'deadline'), KNOWN_S (when the
    product gives it up: the watchdog's detection) and the moments that bill."""

    registered_s: float | None
    first_step_s: float | None
    failed_in: str
    known_s: float | None
    running_s: float | None
    pull_s: float
    download_s: float
    job: JobShape = FIELD
    loading_s: float | None = None  # created → loading: the pull starts (None: never)
    pull_share: float = 1.0  # the share of the image a stalled pull gets to

    @property
    def ok(self) -> bool:
        return self.first_step_s is not None

    @property
    def incident(self) -> str:
        """The memory's word for its failure (``hosts.selection.machine_memory``)."""
        if self.ok:
            return ""
        if self.registered_s is None or self.known_s <= self.registered_s:
            return (
                "never_ready" if self.failed_in in ("never ready", "deadline") else "lost_loading"
            )
        return "lost_running"


def play(
    offer: Offer, traits: Traits, fate: Fate, *, bytes_deadline: bool, rng, job: JobShape = FIELD
) -> Played:
    """OFFER's rental on these draws, given up by the flat timeout or the deadline from bytes."""
    out = start_outcome(traits, fate, job.start)
    rate = down_bytes_per_s(traits)
    pull_s, download_s = job.image_b / rate, job.model_b / rate
    registered = out.running_after_s + REGISTER_S if out.running_after_s is not None else None
    loss = out.failed_after_s
    if loss is not None and registered is not None and loss < registered:
        registered = None  # lost between running and the register
    loading = None if fate.never_ready == "created" else fate.scheduling_s
    share = fate.stall_at if fate.never_ready == "loading" else 1.0
    pulling = {"job": job, "loading_s": loading, "pull_share": share}
    phase = rng.uniform(0.0, POLL_S)  # where the provider poll falls in this rental's clock
    due = _deadline(offer, fate, out.running_after_s, pull_s, bytes_deadline, phase, job.image_b)
    first_step = None
    if out.succeeded:
        ready = out.running_after_s + REGISTER_S + job.setup_s + download_s
        first_step = ready + job.load_s + job.step_s
    if registered is None or registered > due:
        # No agent by its deadline: given up then, unless the poll saw the host go first.
        if loss is not None and loss < due:
            known = _next_poll(loss, phase)
            running = out.running_after_s
            return Played(None, None, out.failed_in, known, running, pull_s, download_s, **pulling)
        words = out.failed_in or "deadline"  # a healthy host slower than its deadline
        running = _before(out.running_after_s, due)
        return Played(None, None, words, due, running, pull_s, download_s, **pulling)
    if first_step is None:  # lost after its register: the next poll
        known = _next_poll(loss, phase)
        run = out.running_after_s
        return Played(registered, None, out.failed_in, known, run, pull_s, download_s, **pulling)
    running = out.running_after_s
    return Played(registered, first_step, "", None, running, pull_s, download_s, **pulling)


def first_step_s(traits: Traits, fate: Fate, job: JobShape = FIELD) -> tuple | None:
    """Create → first step of a rental that succeeds on these draws, and its parts (provider
    start, image pull, model download); None when it fails. What perfect knowledge rents."""
    out = start_outcome(traits, fate, job.start)
    if not out.succeeded:
        return None
    rate = down_bytes_per_s(traits)
    download = job.model_b / rate
    first = out.running_after_s + REGISTER_S + job.setup_s + download + job.load_s + job.step_s
    return first, fate.scheduling_s, job.image_b / rate, download


def chance_to_fail(traits: Traits, job: JobShape = FIELD) -> float:
    """The chance a rental of the machine with TRAITS fails JOB, or loses it while it runs,
    from its hidden traits (``start_outcome``'s hazards over the job's own seconds): what a
    memory that knew every machine would price. The memory's bound ranks by it."""
    rate = down_bytes_per_s(traits)
    moving_h = (job.image_b + job.model_b) / rate / 3600
    running_h = (REGISTER_S + job.setup_s + job.model_b / rate + job.load_s) / 3600
    running_h += job.steps * job.step_s / 3600
    survives = (1.0 - traits.never_ready_p) * math.exp(
        -traits.load_hazard_per_h * moving_h - traits.run_hazard_per_h * running_h
    )
    return 1.0 - survives


def _before(moment: float | None, end: float) -> float | None:
    return moment if moment is not None and moment < end else None


def _next_poll(at: float, phase: float) -> float:
    return phase + POLL_S * math.ceil(max(at - phase, 0.0) / POLL_S)


def _deadline(offer, fate, running_s, pull_s, bytes_deadline: bool, phase: float, image_b) -> float:
    """Seconds from the create to the start deadline, as the watchdog would move it."""
    if not bytes_deadline:
        return FLAT_TIMEOUT_S
    rented = EPOCH
    plan = sd.StartPlan(
        rented_at=rented,
        image_gb=image_b / sd.GIB,
        image_held=False,
        link=sd.link_for(None, offer.inet_down_mbps),
        start_timeout_s=FLAT_TIMEOUT_S,
    )
    due = sd.start_due(plan)
    loading = None if fate.never_ready == "created" else fate.scheduling_s
    stalled = loading + fate.stall_at * pull_s if fate.never_ready == "loading" else math.inf
    before = ("created", "")
    t = phase
    while t < (due.at - rented).total_seconds():
        if running_s is not None and t >= running_s:
            now = ("running", "")
        elif loading is not None and t >= loading:
            pulled = min(t, stalled) - loading
            now = ("loading", f"Downloading {min(pulled / pull_s, 1.0):.0%}")
        else:
            now = ("created", "")
        news = sd.ProviderNews(before[0], before[1], now[0], now[1])
        pushed = sd.pushed_start_due(plan, due, news, now=rented + timedelta(seconds=t))
        due = pushed or due
        before = now
        t += POLL_S
    return (due.at - rented).total_seconds()


def billed_usd(offer: Offer, played: Played, until_s: float) -> float:
    """What OFFER's rental billed from its create to UNTIL_S (then destroyed): storage from the
    create, the GPU from ``running``, the image and model bytes pulled by then
    (docs/vast-api.md §7)."""
    until = until_s + DESTROY_S
    storage = (offer.storage_usd_per_gb_hour or 0.0) * DISK_GB * until / 3600
    running = played.running_s
    gpu = offer.dph_base * max(until - running, 0.0) / 3600 if running is not None else 0.0
    pulled = 0.0
    if played.loading_s is not None:  # the image from loading on, up to where a stall stops it
        share = max(until - played.loading_s, 0.0) / max(played.pull_s, 1e-9)
        pulled = played.job.image_b * min(share, played.pull_share)
    if running is not None:
        after = until - running - REGISTER_S - played.job.setup_s
        pulled += played.job.model_b * min(max(after, 0.0) / max(played.download_s, 1e-9), 1.0)
    return storage + gpu + (offer.download_usd_per_gb or 0.0) * pulled / 1e9


def job_usd(offer: Offer, played: Played) -> float:
    """The job on its kept host: its start, 300 steps, destroyed after the last."""
    job = played.job
    return billed_usd(offer, played, played.first_step_s + (job.steps - 1) * job.step_s)


def seeded(*parts) -> random.Random:
    return random.Random(":".join(str(p) for p in parts))
