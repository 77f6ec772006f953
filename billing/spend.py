"""Recorded spend: what NomadGPU recorded each attempt costing, from the offer's rates.

Vast bills (``docs/vast-api.md`` §7): GPU per second while the instance runs, storage per
second from creation until destroy, traffic per GB each way in any state. The attempt row
holds the rates copied from the offer at rent time, the moments the poll and the agent saw,
and the byte counters its agent reports, so spend is computed, never accrued in place:
recomputing it is always safe and a recovery can never count an attempt twice (each attempt
is its own interval).

Moments used:
- storage: ``rented_at`` (create accepted) until ``ended_at`` (loss, cancel or finish: the
  instance is destroyed right after) or NOW;
- GPU (``gpu_started_at``): from the provider's ``running``, which is when Vast starts billing
  it: the earliest of the poll's first ``running`` read (``provider_running_at``) and the
  container's own start report (``container_started_at``: the container runs its onstart in
  ``running``, and its report carries no poll's lag of up to ``PROVIDER_POLL_INTERVAL_S``).
  Only where neither was seen (the poll never read it running, an older agent) the agent's
  first call (``registered_at``) stands in: it comes after the bootstrap, seconds late, which
  made short attempts look 1-4 % over-billed. The agent's register stays a phase of the
  recovery anatomy (``jobs.anatomy``). The image pull before ``running`` is billed storage
  only, like Vast's ``loading``;
- neither GPU nor storage while the host was offline and a job waited for it (Vast bills
  no GPU and no storage for an offline host's period): ``offline_hours``;
- traffic, priced per 1024³ bytes each way (``traffic_bytes``): what the host moved, measured
  where anything measured it: the container's counters (``net_rx_bytes``/``net_tx_bytes``:
  every byte since the agent started, the training command's downloads included) or the
  agent's own object counters, whichever is larger (an older agent reports only the latter);
  plus, downloaded, the image pull, which no counter sees, recorded only where it happened
  (``billing.image_pull.recorded_pull``: a machine that never ran the image for the team
  pulled it whole; one that held it pulled only when the poll saw it load long enough).

This is the **recorded** figure, and it is never mixed with the invoice: an import does not
change it, so what was recorded for an attempt never drops when an invoice arrives. The
spending limits count it (``billing.services``, ``billing.enforce``: they limit what NomadGPU
recorded, which it knows at once, not an invoice that comes hours later); reconciliation
compares it with what Vast billed; a job's cost shows it until the invoice covers an attempt
(``billing.cost``), and the invoice then, with its own label.

An attempt that was never rented (no ``rented_at``) has cost nothing.

A hedged rent's racers (``jobs.models.racer``) are the attempt's money too: the winner's
instance is the attempt's own (its times and rates are copied onto the attempt when it wins),
and every other racer (``racer_spend``) is added to the attempt's spend, each at its own
offer's rates: storage from its create (``rented_at``) to its end, the GPU from when the poll
first saw it ``running`` (Vast bills no GPU while ``loading``), and its image pull where its
host bills download, once it began pulling (seen ``loading`` or later): the pull as priced at
rent, whole (the dear side: a racer is destroyed mid-pull, and no counter of ours ran in it).
Their charges are matched to the attempt by instance id (``billing.reconcile.matching``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import datetime

from billing.image_pull import GB, recorded_pull


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


def gpu_started_at(attempt) -> datetime | None:
    """When Vast began billing ATTEMPT's GPU as NomadGPU saw it (module docstring): the
    earliest of the poll's first ``running`` read and the container's start, else the agent's
    first call; None while none was seen."""
    seen = [m for m in (attempt.provider_running_at, attempt.container_started_at) if m]
    started = min(seen) if seen else attempt.registered_at
    if started is None or attempt.rented_at is None:
        return started
    return max(started, attempt.rented_at)  # a host's clock cannot start it before the rent


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


def _own_traffic_bytes(attempt, *, now: datetime) -> tuple[int, int]:
    down = max(attempt.net_rx_bytes, attempt.bytes_down) + recorded_pull(attempt, now=now).bytes
    return down, max(attempt.net_tx_bytes, attempt.bytes_up)


def traffic_bytes(attempt, *, now: datetime) -> tuple[int, int]:
    """Bytes (down, up) ATTEMPT moved as recorded at NOW: the larger counter each way, and
    downloaded, the image pull where it happened (``billing.image_pull``), its other racers'
    pulls too."""
    down, up = _own_traffic_bytes(attempt, now=now)
    return down + sum(racer_pulled_bytes(r, now) for r in racers_not_kept(attempt)), up


def traffic_usd(attempt, *, now: datetime) -> tuple[float, float]:
    """Dollars (download, upload) of ATTEMPT's recorded traffic at NOW, its racers' pulls at
    their own hosts' rates."""
    down, up = _own_traffic_bytes(attempt, now=now)
    racers = sum(
        r.download_usd_per_gb * racer_pulled_bytes(r, now) / GB for r in racers_not_kept(attempt)
    )
    return attempt.download_usd_per_gb * down / GB + racers, attempt.upload_usd_per_gb * up / GB


def offline_hours(attempt, end: datetime) -> float:
    """Hours ATTEMPT's host was offline while its job waited for it, up to END: the spells
    it came back from (``offline_s``) and the one still open (``offline_since``)."""
    seconds = attempt.offline_s or 0.0
    since = attempt.offline_since
    if since is not None and since < end:
        seconds += (end - since).total_seconds()
    return seconds / 3600


def attempt_spend(attempt, *, now: datetime) -> Spend:
    """What ATTEMPT has cost up to NOW (or up to its end, if it ended before NOW), as
    recorded."""
    if attempt.rented_at is None:
        return Spend()
    end = min(attempt.ended_at, now) if attempt.ended_at else now
    download, upload = traffic_usd(attempt, now=end)
    offline = offline_hours(attempt, end)
    gpu_h = max(_hours(gpu_started_at(attempt), end) - offline, 0.0)
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


def _end(attempt, now: datetime) -> datetime:
    return min(attempt.ended_at, now) if attempt.ended_at else now


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
    download, upload = traffic_usd(attempt, now=end)
    racers = racers_not_kept(attempt)
    return Spend(
        gpu=attempt.dph_base * _overlap_hours(gpu_started_at(attempt), end, lo, hi)
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
    """Dollars per hour ATTEMPT costs while it lives (GPU once it runs, storage), traffic
    excluded: it comes in bursts the counters only show afterwards."""
    if attempt.rented_at is None or attempt.ended_at is not None:
        return 0.0
    gpu = attempt.dph_base if gpu_started_at(attempt) is not None else 0.0
    racing = sum(
        r.storage_usd_per_gb_hour * r.disk_gb + (r.dph_base if r.running_at else 0.0)
        for r in racers_not_kept(attempt)
        if r.ended_at is None
    )
    return gpu + attempt.storage_usd_per_gb_hour * attempt.disk_gb + racing
