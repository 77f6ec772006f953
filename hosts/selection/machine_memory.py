"""The team's memory of machines, as plain numbers: what each machine's rentals showed, with
decay, and the posteriors an offer is priced with (``MachineMemory``; ``hosts.models.
MachineRental`` stores the rentals, ``rental_costs.expected_cost`` prices them in).

**Decay.** A rental's figures weigh 0.5^(age / ``HALF_LIFE_DAYS``), its age counted from its end:
a machine's host can fix a flaky link or swap a card, so last month's evidence counts for less.

**Fail to start** (``start_failure_chance``): P(fail) ~ Beta(a0 + F, b0 + S), F the decayed
charged start failures (never ready, lost while loading) and S the decayed rentals that got
ready. The prior's mean comes from the offer's reliability (``prior_start_failure``) and weighs
``PRIOR_STARTS`` starts. Vast's reliability is "historical uptime and health", new machines start
at 0.6 and it drops when "a client instance ... does not want to start" (docs/vast-api.md §8);
it predicts starts weakly: noema's re-baseline (monygroupcorp/noema,
docs/benchmarks/2026-05-04-vastai-rebaseline.md) saw 4 of 10 rentals succeed on offers its
reliability filter had passed. So the mapping is a guess anchored on those figures: a floor of
``PRIOR_FLOOR`` (even a perfect score fails sometimes), ``PRIOR_SLOPE`` per point of
unreliability, and at most ``PRIOR_CEILING`` (noema's failure share; a new machine at 0.6 is
unknown, not known bad). The prior is weak on purpose: a team's own starts outweigh it in a few.

**Lost while running** (``loss_rate_per_h``): losses per rented hour ~ Gamma(k0 + L, t0 + H), L
the decayed charged losses after ready (stalls among them), H the decayed hours from ready to
end; the prior is the team's rate for the GPU model (``PreemptionRates``, on demand: host
losses only) weighed as ``PRIOR_HOURS`` rented hours, as ``preemption`` weighs its own prior.

**Speed and link** (``speed_factor``, ``link_factor``): the decayed mean of measured s/step over
the s/step its DLPerf (or its model's measured speed) promised, and of measured download Mbit/s
over the advertised ``inet_down``, each shrunk to 1 with ``PRIOR_RENTALS`` rental of weight.

**A ban** (``ban_reason``): 2 charged incidents in 7 days (counted, not decayed) set the
machine aside until the older one is 7 days old. Otherwise the memory prices, it never bans.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from hosts.vast import Offer

HALF_LIFE_DAYS = 14.0
HORIZON_DAYS = 90.0  # older rentals weigh under 1.2 %: not read at all
BAN_INCIDENTS = 2
BAN_WINDOW = timedelta(days=7)
PRIOR_FLOOR, PRIOR_SLOPE, PRIOR_CEILING = 0.10, 4.0, 0.60
PRIOR_STARTS = 4.0
PRIOR_HOURS = 10.0
PRIOR_RENTALS = 1.0

NEVER_READY, LOST_LOADING, LOST_RUNNING, STALLED = (
    "never_ready",
    "lost_loading",
    "lost_running",
    "stalled",
)
START_FAILURES = (NEVER_READY, LOST_LOADING)
RUN_LOSSES = (LOST_RUNNING, STALLED)
INCIDENT_WORDS = {
    NEVER_READY: "never ready",
    LOST_LOADING: "lost while loading",
    LOST_RUNNING: "lost while running",
    STALLED: "stalled",
}


@dataclass(frozen=True)
class RentalRecord:
    """One ended rental of a machine (``hosts.models.MachineRental``), as plain values. READY:
    its agent registered. EXCUSED: why its incident is not the machine's ("" when charged)."""

    rented_at: datetime
    ended_at: datetime
    ready: bool
    running_h: float = 0.0
    incident: str = ""
    excused: str = ""
    outbids: int = 0
    speed_ratio: float | None = None  # measured s/step / the s/step promised
    link_ratio: float | None = None  # measured download Mbit/s / advertised

    @property
    def charged(self) -> bool:
        return bool(self.incident) and not self.excused


def weight(age: timedelta) -> float:
    """What a rental AGE old weighs: 0.5^(age / half-life); a future end weighs 1."""
    return 0.5 ** (max(age.total_seconds(), 0.0) / 86400.0 / HALF_LIFE_DAYS)


@dataclass(frozen=True)
class MachineRecord:
    """One machine's rentals summed with decay at one moment (``remember``), and what the words
    and the ban count: RENTALS and INCIDENTS (charged) as counted, SINCE the oldest rental."""

    machine_id: int
    start_failures: float = 0.0
    starts: float = 0.0
    losses: float = 0.0
    running_h: float = 0.0
    speed: tuple[float, float] = (0.0, 0.0)  # (decayed sum of ratios, their weight)
    link: tuple[float, float] = (0.0, 0.0)
    outbids: int = 0
    outbid_h: float = 0.0
    rentals: int = 0
    incidents: tuple[str, ...] = ()  # charged kinds, oldest first
    excused: int = 0
    since: datetime | None = None
    days: float = 0.0  # from SINCE to the moment it was summed
    banned_until: datetime | None = None
    ban_kinds: tuple[str, ...] = ()


def remember(machine_id: int, rentals: Iterable[RentalRecord], now: datetime) -> MachineRecord:
    """MACHINE_ID's RENTALS summed with decay at NOW (those ended within ``HORIZON_DAYS``)."""
    rows = sorted(
        (r for r in rentals if now - r.ended_at <= timedelta(days=HORIZON_DAYS)),
        key=lambda r: r.ended_at,
    )
    sums = dict.fromkeys(("fail", "ok", "loss", "hours", "s", "sw", "l", "lw"), 0.0)
    for r in rows:
        w = weight(now - r.ended_at)
        sums["fail"] += w * (r.charged and r.incident in START_FAILURES)
        sums["ok"] += w * r.ready
        sums["loss"] += w * (r.charged and r.incident in RUN_LOSSES)
        sums["hours"] += w * max(r.running_h, 0.0)
        if r.speed_ratio and r.speed_ratio > 0:
            sums["s"], sums["sw"] = sums["s"] + w * r.speed_ratio, sums["sw"] + w
        if r.link_ratio and r.link_ratio > 0:
            sums["l"], sums["lw"] = sums["l"] + w * r.link_ratio, sums["lw"] + w
    charged = [r for r in rows if r.charged]
    until, kinds = ban_until(charged, now)
    since = min((r.rented_at for r in rows), default=None)
    return MachineRecord(
        machine_id=machine_id,
        start_failures=sums["fail"],
        starts=sums["ok"],
        losses=sums["loss"],
        running_h=sums["hours"],
        speed=(sums["s"], sums["sw"]),
        link=(sums["l"], sums["lw"]),
        outbids=sum(r.outbids for r in rows),
        outbid_h=sum(max(r.running_h, 0.0) for r in rows),
        rentals=len(rows),
        incidents=tuple(r.incident for r in charged),
        excused=sum(bool(r.incident and r.excused) for r in rows),
        since=since,
        days=(now - since).total_seconds() / 86400.0 if since else 0.0,
        banned_until=until,
        ban_kinds=kinds,
    )


def ban_until(charged: list[RentalRecord], now: datetime) -> tuple[datetime | None, tuple]:
    """When a machine with these CHARGED rentals (oldest first) may be rented again: while
    ``BAN_INCIDENTS`` of them ended within ``BAN_WINDOW`` of NOW, until the oldest of those is
    that old; (None, ()) when it is not set aside."""
    recent = [r for r in charged if now - r.ended_at < BAN_WINDOW]
    if len(recent) < BAN_INCIDENTS:
        return None, ()
    last = recent[-BAN_INCIDENTS:]
    return last[0].ended_at + BAN_WINDOW, tuple(r.incident for r in last)


@dataclass(frozen=True)
class MachineMemory:
    """The team's record of each machine it rented (``remember``), by machine id. A machine not
    in it is unknown: its offer is priced on the priors alone."""

    records: Mapping[int, MachineRecord] = field(default_factory=dict)

    def record(self, machine_id: int | None) -> MachineRecord | None:
        return None if machine_id is None else self.records.get(machine_id)

    def without(self, machine_id: int | None) -> MachineMemory:
        """This memory with MACHINE_ID forgotten: what the priors alone say of it."""
        return MachineMemory({m: r for m, r in self.records.items() if m != machine_id})


NO_MEMORY = MachineMemory()


def prior_start_failure(reliability: float | None) -> float:
    """The chance a start fails before any rental of the machine, from Vast's reliability (the
    module docstring: a guess anchored on Vast's docs and noema's run); unknown reads as new."""
    r = 0.6 if reliability is None else min(max(float(reliability), 0.0), 1.0)
    return min(PRIOR_FLOOR + PRIOR_SLOPE * (1.0 - r), PRIOR_CEILING)


def start_failure_chance(memory: MachineMemory, offer: Offer) -> float:
    """P(a rental of OFFER's machine never gets ready): the Beta posterior's mean, the prior
    from the offer's reliability weighing ``PRIOR_STARTS`` starts. (The race reads this.)"""
    return start_failure_p(memory.record(offer.machine_id), offer.reliability)


def start_failure_p(record: MachineRecord | None, reliability: float | None) -> float:
    """``start_failure_chance`` of a machine with RECORD (None: unknown) and RELIABILITY."""
    prior = prior_start_failure(reliability)
    failed, ready = (record.start_failures, record.starts) if record else (0.0, 0.0)
    a0, b0 = prior * PRIOR_STARTS, (1.0 - prior) * PRIOR_STARTS
    return (a0 + failed) / (a0 + b0 + failed + ready)


def loss_rate_per_h(memory: MachineMemory, offer: Offer, prior_per_h: float) -> float:
    """Losses per rented hour of OFFER's machine: the Gamma posterior's mean, the prior the
    team's rate PRIOR_PER_H for its GPU model weighing ``PRIOR_HOURS`` hours."""
    seen = memory.record(offer.machine_id)
    if seen is None:
        return prior_per_h
    return (prior_per_h * PRIOR_HOURS + seen.losses) / (PRIOR_HOURS + seen.running_h)


def _shrunk(pair: tuple[float, float]) -> float:
    total, weight_sum = pair
    return (total + PRIOR_RENTALS) / (weight_sum + PRIOR_RENTALS)


def speed_factor(memory: MachineMemory, machine_id: int | None) -> float:
    """The machine's s/step over what its DLPerf promised (1: as promised; 1.5: slower)."""
    seen = memory.record(machine_id)
    return _shrunk(seen.speed) if seen else 1.0


def link_factor(memory: MachineMemory, machine_id: int | None) -> float:
    """The share of its advertised download link the machine delivered (1: all of it)."""
    seen = memory.record(machine_id)
    return _shrunk(seen.link) if seen else 1.0


def seen_offer(memory: MachineMemory, offer: Offer) -> Offer:
    """OFFER with the download link its machine really showed (the cost model's bandwidth)."""
    factor = link_factor(memory, offer.machine_id)
    if factor == 1.0 or not offer.inet_down_mbps:
        return offer
    return replace(offer, inet_down_mbps=offer.inet_down_mbps * factor)


def ban_reason(memory: MachineMemory, offer: Offer) -> str | None:
    """Why OFFER's machine is set aside (``ban_until``, as of the moment the memory was summed),
    or None."""
    seen = memory.record(offer.machine_id)
    if seen is None or seen.banned_until is None:
        return None
    kinds = ", ".join(INCIDENT_WORDS.get(k, k) for k in seen.ban_kinds)
    return (
        f"machine {offer.machine_id}: {len(seen.ban_kinds)} incidents in "
        f"{BAN_WINDOW.days} days ({kinds}): not rented again before "
        f"{seen.banned_until:%Y-%m-%d %H:%M} UTC"
    )


def memory_parts(record: MachineRecord) -> tuple[str, tuple[str, ...]]:
    """RECORD in words: the head ("machine 48211: lost 2 of 3 rentals in 9 days (half-life
    14 d)") and the notes (its incidents, what its speed, link and outbids showed, and how many
    incidents were not charged)."""
    days = max(round(record.days), 1)
    lost = len(record.incidents)
    head = f"machine {record.machine_id}: lost {lost} of {record.rentals} rental"
    head += f"{'s' if record.rentals != 1 else ''} in {days} day{'s' if days != 1 else ''}"
    head += f" (half-life {HALF_LIFE_DAYS:g} d)"
    notes = [", ".join(INCIDENT_WORDS.get(k, k) for k in record.incidents)] if lost else []
    if record.speed[1]:
        notes.append(f"{_shrunk(record.speed):.2f} times the s/step its DLPerf promised")
    if record.link[1]:
        notes.append(f"downloads at {_shrunk(record.link):.0%} of its advertised link")
    if record.outbids:
        notes.append(f"outbid {record.outbids} times in {record.outbid_h:.1f} h rented")
    if record.excused:
        notes.append(f"{record.excused} more not charged (not the machine's doing)")
    return head, tuple(notes)


def memory_words(head: str, notes: tuple[str, ...] = (), added: str = "") -> str:
    """ "machine 48211: lost 2 of 3 rentals in 9 days (half-life 14 d): +$0.31 expected; never
    ready, ...": HEAD and NOTES (``memory_parts``) with ADDED, what the record adds to an
    offer's expected total as the caller writes money ("+$0.31"; "" for none)."""
    return "; ".join([f"{head}: {added} expected" if added else head, *notes])
