"""Geometry of the daily interruptions bar chart, drawn as inline SVG by the page template.

The SVG holds only the plot (bars, baseline, the peak's dashed line) and stretches to its box
(``preserveAspectRatio="none"``), so the chart fits a phone's width with every day in view,
today's at the right edge; its labels (the peak, the dates) are HTML beside it, so they keep
their size instead of shrinking with the drawing."""

from __future__ import annotations

from dataclasses import dataclass

from statuspage.stats import DayCount

WIDTH, HEIGHT = 720, 150  # the SVG viewBox; the SVG stretches to its container
LEFT, RIGHT, TOP, BOTTOM = 0, 0, 2, 1  # the labels are HTML outside the drawing


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str  # the bar's tooltip and accessible name


@dataclass(frozen=True)
class Tick:
    x: float
    text: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    baseline: float
    plot_left: float
    plot_right: float
    top: float
    peak: int  # the count the top of the plot stands for
    bars: tuple[Bar, ...]
    ticks: tuple[Tick, ...]  # date labels under the first, middle and last bars


def bar_chart(daily: tuple[DayCount, ...]) -> Chart:
    """One bar per day, heights scaled to the busiest day (at least 1, so zero stays flat)."""
    peak = max((d.interruptions for d in daily), default=0) or 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(len(daily), 1)
    bars = []
    for i, day in enumerate(daily):
        height = plot_h * day.interruptions / peak
        noun = "interruption" if day.interruptions == 1 else "interruptions"
        bars.append(
            Bar(
                x=round(LEFT + i * slot + slot * 0.15, 2),
                y=round(TOP + plot_h - height, 2),
                width=round(slot * 0.7, 2),
                height=round(height, 2),
                label=f"{day.day:%a %d %b %Y}: {day.interruptions} {noun}",
            )
        )
    marks = sorted({0, len(daily) // 2, len(daily) - 1}) if daily else []
    ticks = tuple(
        Tick(x=round(LEFT + (i + 0.5) * slot, 2), text=f"{daily[i].day:%d %b}") for i in marks
    )
    return Chart(WIDTH, HEIGHT, TOP + plot_h, LEFT, WIDTH - RIGHT, TOP, peak, tuple(bars), ticks)
