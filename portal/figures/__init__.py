"""What the portal shows about jobs, computed from rows: progress, ETA, spend, projections,
the timeline, offers before submit and the points of the charts. Plain functions of data and
``now``; the views only fetch and render.

One figure per file:

- ``job_rows``: a row of the job list (progress, the one cost, the projection); the team's month.
- ``job_timeline``: the job page's events, a lost host's with its interruption.
- ``charts``: the loss and spend charts as SVG coordinates.
- ``offers``: the offers table and the preview of the best offers for a spec.
- ``blockers``: why a spec can never be rented now (no bid taken, too many GPUs for one host).
- ``estimates``: which figures of an estimate were measured and which typed.
- ``gpus``: the GPUs of an attempt's latest heartbeat.

This module re-exports the public names, so views keep writing ``figures.job_row``.
"""

from __future__ import annotations

from portal.figures.blockers import gpu_count_blocker, interruptible_blocker
from portal.figures.charts import Chart, line_chart, loss_series, spend_series, spend_text
from portal.figures.estimates import estimate_figures, preview_figures, spec_history
from portal.figures.gpus import GpuRow, gpu_row, gpu_rows
from portal.figures.job_rows import (
    JobRow,
    current_attempt,
    job_row,
    projected_cost,
    team_month_spend,
    with_portal_data,
)
from portal.figures.job_timeline import TimelineEntry, timeline
from portal.figures.offers import (
    PREVIEW_RETRY,
    PREVIEW_TOP_N,
    OfferRow,
    OffersPreview,
    offer_row,
    offer_rows,
    preview_offers,
)

__all__ = [
    "PREVIEW_RETRY",
    "PREVIEW_TOP_N",
    "Chart",
    "GpuRow",
    "JobRow",
    "OfferRow",
    "OffersPreview",
    "TimelineEntry",
    "current_attempt",
    "estimate_figures",
    "gpu_count_blocker",
    "gpu_row",
    "gpu_rows",
    "interruptible_blocker",
    "job_row",
    "line_chart",
    "loss_series",
    "offer_row",
    "offer_rows",
    "preview_figures",
    "preview_offers",
    "projected_cost",
    "spec_history",
    "spend_series",
    "spend_text",
    "team_month_spend",
    "timeline",
    "with_portal_data",
]
