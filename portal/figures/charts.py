"""The job page's line charts: loss by step and spend over time, as SVG coordinates."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from billing.cost import JobCost
from billing.cost_in_time import cost_series
from jobs.models import Job, loss_sample_every
from nomadgpu.humanize import money


@dataclass(frozen=True)
class Chart:
    """A line chart as SVG coordinates: ``points`` for a polyline, the axes' ranges for labels."""

    points: str
    x_min: float
    x_max: float
    y_min: float
    y_max: float
    count: int
    width: int = 600
    height: int = 160
    pad: int = 6
    y_format: Callable[[float], str] = str  # how the axis labels read

    @property
    def y_min_text(self) -> str:
        return self.y_format(self.y_min)

    @property
    def y_max_text(self) -> str:
        return self.y_format(self.y_max)


def line_chart(
    series: list[tuple[float, float]],
    *,
    width: int = 600,
    height: int = 160,
    y_format: Callable[[float], str] = str,
) -> Chart | None:
    """SERIES (x, y pairs) scaled into a WIDTH x HEIGHT box, y up, its axis labels written by
    Y_FORMAT; None with under two points."""
    if len(series) < 2:
        return None
    xs, ys = [x for x, _ in series], [y for _, y in series]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    pad = 6
    sx = (width - 2 * pad) / ((x1 - x0) or 1)
    sy = (height - 2 * pad) / ((y1 - y0) or 1)
    pts = " ".join(
        f"{pad + (x - x0) * sx:.1f},{height - pad - (y - y0) * sy:.1f}" for x, y in series
    )
    return Chart(pts, x0, x1, y0, y1, len(series), width, height, pad, y_format)


def spend_text(usd: float) -> str:
    """A spend chart's axis label, by the one money rule (``nomadgpu.humanize.money``)."""
    return money(usd)


def loss_series(job: Job) -> list[tuple[float, float]]:
    """(step, loss) from the sampled loss points."""
    return [(float(s), float(v)) for s, v in job.loss_points.values_list("step", "loss")]


@dataclass(frozen=True)
class LatestLoss:
    """The newest loss a host reported, as the progress line shows it."""

    step: int
    loss: float
    sample_every: int  # steps between two of the chart's samples (``loss_sample_every``)


def latest_loss(job: Job) -> LatestLoss | None:
    """The newest attempt's reported loss and its step (attempts prefetched), None before any.

    The loss card shows it while the chart has under two samples: the chart keeps one loss
    per ``loss_sample_every`` steps, while the progress line shows every beat's, so for the
    first steps a loss is known before there is a line to draw."""
    attempts = sorted(job.attempts.all(), key=lambda a: a.number, reverse=True)
    found = next((a for a in attempts if a.loss is not None and a.step is not None), None)
    if found is None:
        return None
    every = loss_sample_every(found.total_steps or job.total_steps)
    return LatestLoss(step=found.step, loss=found.loss, sample_every=every)


def spend_series(
    job: Job, *, now: datetime, cost: JobCost, points: int = 40
) -> tuple[list[tuple[float, float]], str]:
    """((time since submit, dollars) at POINTS moments from submit to now or the finish, unit):
    the job's cost so far at each moment by the one cost rule (``billing.cost_in_time``),
    ending at COST, the job's cost (``billing.cost.job_cost``) that the page states.

    The unit (s, min or h) keeps the axis readable for a one-minute toy and a day-long run.
    """
    start = job.created_at
    ends = [a.ended_at for a in job.attempts.all() if a.ended_at]
    end = min(max([job.finished_at or now, *ends]), now)
    if end <= start:
        return [], "s"
    span_s = (end - start).total_seconds()
    unit, per = (
        ("s", 1.0) if span_s < 180 else ("min", 60.0) if span_s < 3 * 3600 else ("h", 3600.0)
    )
    step = (end - start) / (points - 1)
    moments = [start + step * i for i in range(points)]
    dollars = cost_series(job, moments, now=now, cost=cost)
    series = zip(moments, dollars, strict=True)
    return [((t - start).total_seconds() / per, d) for t, d in series], unit
