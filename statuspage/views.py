"""The public status page of an opted-in team: HTML, JSON, Atom feed and SVG badge.

No login. A team that has not opted in (``Team.public_status_page``) or does not exist is a 404
on all four. Numbers come from ``stats.team_status``, cached for ``CACHE_SECONDS`` per team and
window; whether the team is public is checked on every request, so opting out takes effect at
once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib.syndication.views import Feed
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_cache_control
from django.utils.feedgenerator import Atom1Feed

from jobs import anatomy
from nomadgpu.humanize import duration
from nomadgpu.models import Team
from statuspage import costs, stats, weather
from statuspage.chart import bar_chart

CACHE_SECONDS = 30
# 2: recovery_phases_s added (later market_weather). 3: back on a machine and training again as
# jobs.recovery_times defines them (from the loss; training_again_s added, running_again_s kept as
# its copy), and fire drills left out. Every version-2 key is kept.
JSON_VERSION = 3


def public_team_or_404(slug: str) -> Team:
    return get_object_or_404(Team, slug=slug, public_status_page=True)


def cached_status(team: Team, days: int) -> stats.TeamStatus:
    """The team's numbers for DAYS, computed at most once per ``CACHE_SECONDS``."""
    key = f"statuspage:{team.pk}:{days}"
    status = cache.get(key)
    if status is None:
        status = stats.team_status(team, now=timezone.now(), days=days)
        cache.set(key, status, CACHE_SECONDS)
    return status


def requested_days(request: HttpRequest) -> int | None:
    """The ``?days=`` window (7, 30 or 90; 30 when absent), or None when it is not one."""
    raw = request.GET.get("days", str(stats.DEFAULT_WINDOW))
    return int(raw) if raw.isdigit() and int(raw) in stats.WINDOWS else None


def briefly_cacheable(response: HttpResponse) -> HttpResponse:
    patch_cache_control(response, public=True, max_age=CACHE_SECONDS)
    return response


def bad_window() -> HttpResponse:
    return HttpResponseBadRequest("days must be 7, 30 or 90", content_type="text/plain")


def page(request: HttpRequest, slug: str) -> HttpResponse:
    team = public_team_or_404(slug)
    days = requested_days(request)
    if days is None:
        return bad_window()
    status = cached_status(team, days)
    context = {
        "status": status,
        "chart": bar_chart(status.daily),
        "windows": stats.WINDOWS,
        "phase_bars": phase_bars(status.recovery_phases),
    }
    return briefly_cacheable(render(request, "statuspage/status.html", context))


def phase_bars(phases: tuple[stats.PhaseDurations, ...]) -> list[tuple[str, list]]:
    """The recovery phases as two stacked bars, medians and p90s (``anatomy.segments``); a bar
    with nothing known is left out."""
    bars = [
        ("median", anatomy.segments({p.key: p.durations.median_s for p in phases})),
        ("p90", anatomy.segments({p.key: p.durations.p90_s for p in phases})),
    ]
    return [(name, pieces) for name, pieces in bars if pieces]


def as_json(request: HttpRequest, slug: str) -> HttpResponse:
    team = public_team_or_404(slug)
    days = requested_days(request)
    if days is None:
        return bad_window()
    return briefly_cacheable(JsonResponse(status_document(cached_status(team, days))))


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def status_document(status: stats.TeamStatus) -> dict:
    """The JSON body, version 3 (schema in statuspage/README.md; add fields, never rename)."""

    def spans(d: stats.Durations) -> dict:
        return {"count": d.count, "median": d.median_s, "p90": d.p90_s}

    def check(c: stats.Check) -> dict:
        return {"ok": c.ok, "last_seen_at": iso(c.last_seen_at), "silent_s": c.silent_s}

    return {
        "version": JSON_VERSION,
        "team": {"slug": status.team_slug, "name": status.team_name},
        "time_zone": status.time_zone,
        "generated_at": iso(status.generated_at),
        "window": {"days": status.days, "since": iso(status.since)},
        "interruptions": status.interruptions,
        "resumed": status.resumed,
        "cancelled_before_recovery": status.cancelled_before_recovery,
        "recovering": status.recovering,
        "percentile_method": "nearest-rank",
        "back_on_machine_s": spans(status.back_on_machine),
        "training_again_s": spans(status.training_again),
        "running_again_s": spans(status.training_again),  # version 2's name for it
        "detection_s": spans(status.detection),
        "recovery_phases_s": {p.key: spans(p.durations) for p in status.recovery_phases},
        "jobs_running_now": status.running_now,
        "daily": [
            {"date": d.day.isoformat(), "interruptions": d.interruptions} for d in status.daily
        ],
        "interruption_cost_usd": interruption_cost_document(status.interruption_cost),
        "savings": savings_document(status.savings),
        "incidents": [incident_document(i) for i in status.incidents],
        "market_weather": weather_document(status),
        "health": {
            "watchdog": check(status.health.watchdog),
            "worker_and_beat": check(status.health.worker_and_beat),
            "provider": check(status.health.provider),
            "agent_api_outages": [outage_document(o) for o in status.health.outages],
            "jobs_needing_attention": status.health.needs_attention,
        },
    }


def interruption_cost_document(c: costs.InterruptionCost) -> dict:
    """The window's interruptions in dollars (added within version 2)."""
    return {
        "interruptions_priced": c.priced,
        "steps_redone": c.steps_redone,
        "redone_work": round(c.redone_usd, 6),
        "startup_again": round(c.startup_usd, 6),
        "total": round(c.total_usd, 6),
    }


def savings_document(s: costs.WindowSavings) -> dict:
    """The window's jobs against the reference cloud (added within version 2)."""
    pct = s.saved_pct
    return {
        "jobs": s.jobs,
        "jobs_invoiced": s.jobs_invoiced,
        "cost_usd": round(s.cost_usd, 6),
        "invoiced_usd": round(s.invoiced_usd, 6),
        "reference": {
            "name": s.reference_name,
            "usd_per_hour": s.reference_usd_per_hour,
            "speed_factor": s.reference_speed_factor,
        },
        "reference_usd": round(s.reference_usd, 6),
        "saved_usd": round(s.saved_usd, 6),
        "saved_pct": None if pct is None else round(pct, 1),
    }


def weather_document(status: stats.TeamStatus) -> dict:
    """Per GPU model with at least ``weather.MIN_RENTALS`` rentals in the window (added within
    version 2; statuspage/README.md): no machine, job or price."""
    return {
        "min_rentals": weather.MIN_RENTALS,
        "models_hidden": status.weather_hidden_models,
        "models": [weather_cell_document(c) for c in status.market_weather],
    }


def weather_cell_document(cell: stats.WeatherCell) -> dict:
    m = cell.model
    share = m.start_success
    rate = m.losses_per_h
    return {
        "gpu_name": m.gpu_name,
        "rentals": m.rentals,
        "rent_to_ready_s": {
            "count": cell.rent_to_ready.count,
            "median": cell.rent_to_ready.median_s,
            "p90": cell.rent_to_ready.p90_s,
        },
        "start_success": {
            "decided": m.decided,
            "ready": m.ready,
            "share": None if share is None else round(share, 4),
        },
        "host_losses": {
            "losses": m.losses,
            "rented_h": round(m.rented_h, 3),
            "per_rented_hour": None if rate is None else round(rate, 4),
        },
    }


def outage_document(o: stats.OutageLine) -> dict:
    return {
        "cause": o.cause,
        "started_at": iso(o.started_at),
        "ended_at": iso(o.ended_at),
        "seconds": round(o.seconds, 1),
        "jobs_declared_lost": o.lost_during,
        "summary": o.sentence,
    }


def incident_document(i: stats.Incident) -> dict:
    return {
        "ref": i.ref,
        "cause": i.cause,
        "cause_label": i.cause_label,
        "outcome": i.outcome,
        "detected_at": iso(i.detected_at),
        "lost_at": iso(i.lost_at),
        "back_on_machine_at": iso(i.back_on_machine_at),
        "training_again_at": iso(i.training_again_at),
        "back_on_machine_s": i.back_on_machine_s,
        "training_again_s": i.training_again_s,
        "running_again_at": iso(i.back_on_machine_at),  # version 2's name: the replacement running
        "resumed_step": i.resumed_step,
    }


def badge_colour(p90_s: float | None) -> str:
    """Green when the p90 until training again is under 10 min, amber under an hour."""
    if p90_s is None:
        return "#667085"
    if p90_s < 600:
        return "#0f7b3f"
    return "#b54708" if p90_s < 3600 else "#b42318"


def badge(request: HttpRequest, slug: str) -> HttpResponse:
    team = public_team_or_404(slug)
    days = requested_days(request)
    if days is None:
        return bad_window()
    # The time a user waits: from the loss until training again (jobs.recovery_times).
    p90 = cached_status(team, days).training_again.p90_s
    label, value = "training again p90", duration(p90, none="no data")
    # About 7 px per character of 11 px Verdana, plus padding: close to shields.io's sizes.
    label_w, value_w = 10 + 7 * len(label), 10 + 7 * len(value)
    context = {
        "label": label,
        "value": value,
        "colour": badge_colour(p90),
        "label_w": label_w,
        "value_w": value_w,
        "width": label_w + value_w,
        "label_x": label_w / 2,
        "value_x": label_w + value_w / 2,
    }
    response = render(request, "statuspage/badge.svg", context, content_type="image/svg+xml")
    return briefly_cacheable(response)


@dataclass(frozen=True)
class FeedEntry:
    incident: stats.Incident
    link: str


class InterruptionFeed(Feed):
    """Atom feed of the team's interruptions over the last 90 days, newest first."""

    feed_type = Atom1Feed
    limit = 50

    def get_object(self, request: HttpRequest, slug: str) -> stats.TeamStatus:
        return cached_status(public_team_or_404(slug), max(stats.WINDOWS))

    def __call__(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        return briefly_cacheable(super().__call__(request, *args, **kwargs))

    def title(self, status: stats.TeamStatus) -> str:
        return f"{status.team_name}: interruptions"

    def subtitle(self, status: stats.TeamStatus) -> str:
        return "Hosts lost under this team's jobs and how soon they were back (NomadGPU)."

    def link(self, status: stats.TeamStatus) -> str:
        return reverse("statuspage:page", args=[status.team_slug])

    def items(self, status: stats.TeamStatus) -> list[FeedEntry]:
        page_url = self.link(status)
        return [
            FeedEntry(i, f"{page_url}#incident-{i.ref}") for i in status.incidents[: self.limit]
        ]

    def item_title(self, entry: FeedEntry) -> str:
        return f"Host lost: {entry.incident.cause_label} ({entry.incident.outcome})"

    def item_description(self, entry: FeedEntry) -> str:
        return incident_summary(entry.incident)

    def item_link(self, entry: FeedEntry) -> str:
        return entry.link

    def item_guid(self, entry: FeedEntry) -> str:
        return f"urn:nomadgpu:incident:{entry.incident.ref}"

    item_guid_is_permalink = False

    def item_pubdate(self, entry: FeedEntry) -> datetime:
        return entry.incident.detected_at

    def item_updateddate(self, entry: FeedEntry) -> datetime:
        i = entry.incident
        return i.training_again_at or i.back_on_machine_at or i.detected_at


def incident_summary(i: stats.Incident) -> str:
    """One incident in a sentence (feed entries): when, how long until back (both figures,
    from the loss), which step."""
    parts = [f"Detected {i.detected_at:%Y-%m-%d %H:%M %Z}: {i.cause_label}."]
    if i.back_on_machine_s is not None:
        parts.append(f"Back on a machine after {duration(i.back_on_machine_s)}.")
    if i.training_again_s is not None:
        parts.append(
            f"Training again after {duration(i.training_again_s)}, "
            f"resumed from step {i.resumed_step}."
        )
    elif i.outcome == "cancelled":
        parts.append("The job was cancelled before it recovered.")
    elif i.outcome == "resumed":
        parts.append("Waiting for the first training step.")
    else:
        parts.append("Still recovering.")
    return " ".join(parts)
