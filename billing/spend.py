"""Recorded spend: what NomadGPU believes each attempt has cost, from the offer's rates.

Vast bills (``docs/vast-api.md`` §7): GPU per second while the instance runs, storage per
second from creation until destroy, traffic per GB each way in any state. The attempt row
holds the rates copied from the offer at rent time and the byte counters its agent reports, so
spend is computed, never accrued in place: recomputing it is always safe and a recovery can
never count an attempt twice (each attempt is its own interval).

Moments used:
- storage: ``rented_at`` (create accepted) until ``ended_at`` (loss, cancel or finish: the
  instance is destroyed right after) or NOW;
- GPU: ``registered_at`` (the container runs the onstart script, so the agent's first call
  marks the start of ``running``) until the same end. The image pull before it is billed
  storage only, like Vast's ``loading``;
- neither GPU nor storage while the host was offline and a job waited for it (Vast bills
  no GPU and no storage for an offline host's period): ``offline_hours``;
- traffic, priced per 1024³ bytes each way, is *measured* (``traffic_bytes``): the container's
  counters (``net_rx_bytes``/``net_tx_bytes``: every byte since the agent started, the training
  command's downloads included) or the agent's own object counters, whichever is larger (an
  older agent reports only the latter); plus, downloaded, the image pull as priced at rent (the
  profile's ``image_gb`` in the attempt's decision), counted from the rent: the pull happens
  before the agent starts, so no counter sees it. An adopted instance has no estimate.

The invoice replaces the estimate. Once an import has billed the attempt's traffic
(``billed_download_usd``/``billed_upload_usd``, copied by ``reconcile.note_billed_traffic``
with the moment the import covers, ``billed_through``):
- an attempt that ended by that moment costs exactly what was billed: the invoice holds all
  of its traffic, so a cached or smaller image than the profile said shows here;
- a live one (or one that ended after the import) costs the larger of measured and billed: an
  import covers only what was used before its sync, so it must not lower what was measured
  since, and what Vast billed that no counter saw still counts.
Reconciliation compares the measured figure alone (``invoiced=False``): a wrong invoice must
still show as a difference.

An attempt that was never rented (no ``rented_at``) has cost nothing.

A hedged rent's racers (``jobs.models.racer``) are the attempt's money too: the winner's
instance is the attempt's own (its times and rates are copied onto the attempt when it wins),
and every other racer (``racer_spend``) is added to the attempt's spend, each at its own
offer's rates: storage from its create (``rented_at``) to its end, the GPU from when the poll
first saw it ``running`` (Vast bills no GPU while ``loading``), and its image pull where its
host bills download, once it began pulling (seen ``loading`` or later): the pull as priced at
rent, whole, the dear side as for an attempt. Their charges are matched to the attempt by
instance id (``billing.reconcile.matching``), so the invoice's rule above covers their traffic
too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import UTC, datetime

from jobs.rent_decision import RentDecision

GB = 1024**3


@dataclass(frozen=True)
class Spend:
    """Dollars per billing component; ``total`` is their sum."""

    gpu: float = 0.0
    storage: float = 0.0
    download: float = 0.0
    upload: float = 0.0

    @property
    def total(self) -> float:
        return self.gpu + self.storage + self.download + self.upload

    def __add__(self, other: Spend) -> Spend:
        return Spend(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def as_dict(self) -> dict[str, float]:
        """JSON-ready, with the total."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "total": self.total}


def _hours(start: datetime | None, end: datetime) -> float:
    if start is None or end <= start:
        return 0.0
    return (end - start).total_seconds() / 3600.0


def image_pull_bytes(attempt) -> int:
    """The image pull as priced when ATTEMPT was rented (0 without a rent decision)."""
    return int(RentDecision.of(attempt).image_gb * GB)


def racers_not_kept(attempt) -> list:
    """ATTEMPT's racers whose instance is not its own (all but the winner) that a create
    made; [] for a plain rent. Read once per attempt object (a prefetch of ``racers`` serves
    it), as its charges are."""
    if not getattr(attempt, "raced", 0):
        return []
    cached = attempt.__dict__.get("_racers_not_kept")
    if cached is None:
        cached = [r for r in attempt.racers.all() if r.state != "won" and r.rented_at is not None]
        attempt.__dict__["_racers_not_kept"] = cached
    return cached


def racer_pulled_bytes(racer, end: datetime) -> int:
    """The image bytes RACER pulled by END: its pull as priced, once it began pulling."""
    began = racer.loading_at or racer.running_at or racer.registered_at
    return int(racer.pull_gb * GB) if began is not None and began <= end else 0


def racer_spend(racer, *, now: datetime) -> Spend:
    """What one racer of a hedged rent cost up to NOW, or its end (module docstring)."""
    if racer.rented_at is None:
        return Spend()
    end = min(racer.ended_at, now) if racer.ended_at else now
    return Spend(
        gpu=racer.dph_base * _hours(racer.running_at, end),
        storage=racer.storage_usd_per_gb_hour * racer.disk_gb * _hours(racer.rented_at, end),
        download=racer.download_usd_per_gb * racer_pulled_bytes(racer, end) / GB,
    )


def _end(attempt, now: datetime) -> datetime:
    return min(attempt.ended_at, now) if attempt.ended_at else now


def traffic_bytes(attempt) -> tuple[int, int]:
    """Bytes (down, up) ATTEMPT moved as measured, the image pull estimate included (its
    racers' pulls too)."""
    down = max(attempt.net_rx_bytes, attempt.bytes_down) + image_pull_bytes(attempt)
    end = attempt.ended_at or datetime.max.replace(tzinfo=UTC)
    down += sum(racer_pulled_bytes(r, end) for r in racers_not_kept(attempt))
    return down, max(attempt.net_tx_bytes, attempt.bytes_up)


def traffic_usd(
    attempt, *, invoiced: bool = True, now: datetime | None = None
) -> tuple[float, float]:
    """Dollars (download, upload) of ATTEMPT's traffic: measured, or with INVOICED what the
    imported invoice billed, by the rule in the module docstring. Its racers' pulls are
    priced at their own hosts' rates."""
    own_down = max(attempt.net_rx_bytes, attempt.bytes_down) + image_pull_bytes(attempt)
    up = max(attempt.net_tx_bytes, attempt.bytes_up)
    end = _end(attempt, now) if now is not None else attempt.ended_at
    end = end or datetime.max.replace(tzinfo=UTC)
    racers = sum(
        r.download_usd_per_gb * racer_pulled_bytes(r, end) / GB for r in racers_not_kept(attempt)
    )
    measured = (
        attempt.download_usd_per_gb * own_down / GB + racers,
        attempt.upload_usd_per_gb * up / GB,
    )
    if not invoiced or attempt.billed_through is None:
        return measured
    billed = (attempt.billed_download_usd or 0.0, attempt.billed_upload_usd or 0.0)
    if attempt.ended_at is not None and attempt.ended_at <= attempt.billed_through:
        return billed
    return max(measured[0], billed[0]), max(measured[1], billed[1])


def offline_hours(attempt, end: datetime) -> float:
    """Hours ATTEMPT's host was offline while its job waited for it, up to END: the spells
    it came back from (``offline_s``) and the one still open (``offline_since``)."""
    seconds = attempt.offline_s or 0.0
    since = attempt.offline_since
    if since is not None and since < end:
        seconds += (end - since).total_seconds()
    return seconds / 3600


def attempt_spend(attempt, *, now: datetime, invoiced: bool = True) -> Spend:
    """What ATTEMPT has cost up to NOW (or up to its end, if it ended before NOW); INVOICED
    False leaves billed traffic out (reconciliation's recorded side)."""
    if attempt.rented_at is None:
        return Spend()
    end = _end(attempt, now)
    download, upload = traffic_usd(attempt, invoiced=invoiced, now=now)
    offline = offline_hours(attempt, end)
    gpu_h = max(_hours(attempt.registered_at, end) - offline, 0.0)
    storage_h = max(_hours(attempt.rented_at, end) - offline, 0.0)
    racers = [racer_spend(r, now=end) for r in racers_not_kept(attempt)]
    return Spend(
        gpu=attempt.dph_base * gpu_h + sum(r.gpu for r in racers),
        storage=attempt.storage_usd_per_gb_hour * attempt.disk_gb * storage_h
        + sum(r.storage for r in racers),
        download=download,
        upload=upload,
    )


def total_spend(attempts: Iterable, *, now: datetime) -> Spend:
    """The sum of ``attempt_spend`` over ATTEMPTS (e.g. a job's, or a team's in a period)."""
    out = Spend()
    for attempt in attempts:
        out = out + attempt_spend(attempt, now=now)
    return out


def job_spend(job, *, now: datetime) -> Spend:
    """Everything JOB has cost so far, across all its attempts (recoveries included once each)."""
    return total_spend(job.attempts.all(), now=now)


def _overlap_hours(start: datetime | None, end: datetime, lo: datetime, hi: datetime) -> float:
    if start is None:
        return 0.0
    return _hours(max(start, lo), min(end, hi))


def attempt_spend_between(attempt, lo: datetime, hi: datetime, *, now: datetime) -> Spend:
    """The part of ATTEMPT's spend that falls in the window [LO, HI) as seen at NOW.

    GPU and storage time are clipped to the window, so a job running across midnight counts
    in both days for the time it ran in each. The byte counters (and the invoice's traffic)
    carry no timestamps: traffic is spread evenly over the instance's life so far (rent to
    end, or NOW), so the shares of all periods still add up to the attempt's traffic once.
    """
    if attempt.rented_at is None:
        return Spend()
    end = min(attempt.ended_at, now) if attempt.ended_at else now
    life_h = _hours(attempt.rented_at, end)
    share = _overlap_hours(attempt.rented_at, end, lo, hi) / life_h if life_h > 0 else 0.0
    if life_h == 0 and lo <= attempt.rented_at < hi:
        share = 1.0
    download, upload = traffic_usd(attempt, now=now)
    racers = racers_not_kept(attempt)
    return Spend(
        gpu=attempt.dph_base * _overlap_hours(attempt.registered_at, end, lo, hi)
        + sum(r.dph_base * _overlap_hours(r.running_at, _end(r, end), lo, hi) for r in racers),
        storage=attempt.storage_usd_per_gb_hour
        * attempt.disk_gb
        * _overlap_hours(attempt.rented_at, end, lo, hi)
        + sum(
            r.storage_usd_per_gb_hour
            * r.disk_gb
            * _overlap_hours(r.rented_at, _end(r, end), lo, hi)
            for r in racers
        ),
        download=download * share,
        upload=upload * share,
    )


def spend_between(attempts: Iterable, lo: datetime, hi: datetime, *, now: datetime) -> Spend:
    """The sum of ``attempt_spend_between`` over ATTEMPTS (a team's, a member's, a job's)."""
    out = Spend()
    for attempt in attempts:
        out = out + attempt_spend_between(attempt, lo, hi, now=now)
    return out


def burn_rate_per_hour(attempt, *, now: datetime) -> float:
    """Dollars per hour ATTEMPT costs while it lives (GPU once registered, storage), traffic
    excluded: it comes in bursts the counters only show afterwards."""
    if attempt.rented_at is None or attempt.ended_at is not None:
        return 0.0
    gpu = attempt.dph_base if attempt.registered_at is not None else 0.0
    racing = sum(
        r.storage_usd_per_gb_hour * r.disk_gb + (r.dph_base if r.running_at else 0.0)
        for r in racers_not_kept(attempt)
        if r.ended_at is None
    )
    return gpu + attempt.storage_usd_per_gb_hour * attempt.disk_gb + racing
