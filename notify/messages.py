"""What a notification says: facts gathered from the event and its job, rendered from
``templates/notify/<kind>.txt``.

Templates write Telegram's small HTML subset (``<b>``, ``<pre>``) and Django escapes every
value, so the HTML goes to Telegram as is; webhooks get the same text with tags stripped.
Numbers are formatted here (``nomadgpu.humanize``: dollars by its one money rule), so
templates stay short and read like the message; a job's cost and savings are billing's
(``billing.cost.job_cost`` through ``billing.reconcile``), the same number and label the job
page, the member API and the CLI show.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from django.conf import settings
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import strip_tags

from billing.reconcile import machine_and_training_hours, reconcile_job
from jobs import anatomy
from jobs.job_status import early_finish_note
from jobs.models import Interruption, Job, JobEvent
from jobs.recovery_times import recovery_times
from nomadgpu.humanize import duration, money, percent_of
from nomadgpu.team_admins import admin_names
from notify.models import EventKind

LOG_LINES = 8
LOG_LINE_CHARS = 200


@dataclass(frozen=True)
class Message:
    kind: str
    title: str
    html: str  # Telegram HTML
    text: str  # the same, plain
    link: str
    data: dict = field(default_factory=dict)
    event_id: int | None = None
    job_id: int | None = None
    job_name: str = ""
    team_slug: str = ""
    team_name: str = ""
    created_at: str = ""


def job_link(job_id: int) -> str:
    return f"{settings.SITE_URL}{reverse('job-detail', args=[job_id])}"


def build(event: JobEvent) -> Message:
    """The message for EVENT, with the numbers a person on a phone wants first."""
    job = Job.objects.select_related("team").get(pk=event.job_id)
    facts = FACTS.get(event.kind, generic_facts)(event, job)
    title = str(EventKind(event.kind).label) if event.kind in EventKind.values else event.kind
    context = {"event": event, "job": job, "title": title, "link": job_link(job.pk), **facts}
    body = render(event.kind, context)
    return Message(
        kind=event.kind,
        title=title,
        html=body,
        text=plain(body),
        link=context["link"],
        data=webhook_data(event, facts),
        event_id=event.pk,
        job_id=job.pk,
        job_name=job.name,
        team_slug=job.team.slug,
        team_name=job.team.name,
        created_at=event.created_at.isoformat(),
    )


def trial_message(channel) -> Message:
    """What the admin's "send test message" sends."""
    context = {"channel": channel, "team": channel.team, "link": settings.SITE_URL + "/"}
    body = render("test", context)
    return Message(
        kind="test",
        title="Test message",
        html=body,
        text=plain(body),
        link=context["link"],
        team_slug=channel.team.slug,
        team_name=channel.team.name,
    )


def render(kind: str, context: dict) -> str:
    name = f"notify/{kind}.txt" if kind in {*EventKind.values, "test"} else "notify/generic.txt"
    lines = (line.rstrip() for line in render_to_string(name, context).splitlines())
    return "\n".join(line for line in lines if line.strip())  # tags leave empty lines


def plain(body: str) -> str:
    return html.unescape(strip_tags(body))


def webhook_data(event: JobEvent, facts: dict) -> dict:
    """The event's data plus the computed numbers, JSON-safe (formatted strings dropped)."""
    numbers = {k: v for k, v in facts.items() if isinstance(v, int | float | str | None)}
    return {**event.data, **{k: v for k, v in numbers.items() if not k.endswith("_text")}}


# --- facts per kind ---------------------------------------------------------------------


def host_lost_facts(event: JobEvent, job: Job) -> dict:
    data = event.data or {}
    interruption = (
        Interruption.objects.select_related("attempt")
        .filter(job=job, detected_at__lte=event.created_at)
        .order_by("-detected_at")
        .first()
    )
    attempt = interruption.attempt if interruption else None
    silent = None
    if interruption and interruption.last_heartbeat_at:
        silent = (interruption.detected_at - interruption.last_heartbeat_at).total_seconds()
    return {
        "cause": data.get("cause") or (interruption.cause if interruption else "unknown"),
        "drill": bool(interruption.drill) if interruption else bool(data.get("drill")),
        "detail": interruption.detail if interruption else "",
        "step": data.get("step"),
        "total_steps": job.total_steps,
        "last_checkpoint": data.get("last_checkpoint"),
        "silent_s": silent,
        "silent_text": duration(silent, "unknown"),
        "gpu_name": attempt.gpu_name if attempt else "",
        "instance_id": attempt.instance_id if attempt else None,
    }


def running_again_facts(event: JobEvent, job: Job) -> dict:
    """Training again after a loss (the event comes with the first step): both figures from
    the loss (``jobs.recovery_times``), the numbers the job page and the CLI show."""
    interruption = _recovered(event, job)
    attempt = job.attempts.filter(running_at__lte=event.created_at).order_by("-number").first()
    times = recovery_times(interruption) if interruption else None
    back = times.back_on_machine_s if times else None
    training = times.training_again_s if times else None
    return {
        "drill": bool(interruption and interruption.drill),
        "back_on_machine_s": back,
        "back_on_machine_text": duration(back, "unknown"),
        "training_again_s": training,
        "training_again_text": duration(training, "unknown"),
        "resumed_step": interruption.resumed_step if interruption else None,
        "step_reached": interruption.step_reached if interruption else None,
        "resumed_ahead": anatomy.written_after_last_heartbeat(
            interruption.step_reached, interruption.resumed_step
        )
        if interruption
        else "",
        "gpu_name": attempt.gpu_name if attempt else "",
        "price_usd_per_hour": round(attempt.dph_base, 4) if attempt else None,
        "price_text": money(attempt.dph_base, per_hour=True) if attempt else "",
    }


def _recovered(event: JobEvent, job: Job) -> Interruption | None:
    """The interruption a running_again EVENT reports: its lost attempt's, as the event names
    it; else the latest that trained again by then (an event written before it named one)."""
    rows = Interruption.objects.filter(job=job)
    attempt_id = (event.data or {}).get("attempt_id")
    if attempt_id is not None and (row := rows.filter(attempt_id=attempt_id).first()):
        return row
    return (
        rows.filter(running_again_at__lte=event.created_at)
        .order_by("-running_again_at", "-detected_at")
        .first()
    )


def finished_facts(event: JobEvent, job: Job) -> dict:
    end = job.finished_at or event.created_at
    reckoning = reconcile_job(job, now=end)
    machine_h, _ = machine_and_training_hours(job.attempts.all(), now=end)
    cost, saved = reckoning.cost, reckoning.savings
    return {
        "duration_s": (end - job.created_at).total_seconds(),
        "duration_text": duration((end - job.created_at).total_seconds()),
        "machine_s": machine_h * 3600,
        "machine_text": duration(machine_h * 3600),
        "final_step": job.final_step,
        "early_finish": early_finish_note(job),
        "interruptions": job.interruptions.count(),
        "cost_usd": float(cost.total),
        "cost_basis": cost.basis,
        "cost_text": cost.text,
        "cost_split": cost.split,
        "reference_name": job.team.reference_name,
        "reference_usd": round(saved.reference_usd, 4),
        "reference_text": money(saved.reference_usd),
        "savings_usd": round(saved.saved_usd, 4),
        "savings_text": money(saved.saved_usd),
    }


def failed_facts(event: JobEvent, job: Job) -> dict:
    data = event.data or {}
    tail = str(data.get("log_tail") or "")
    lines = [line[:LOG_LINE_CHARS] for line in tail.strip().splitlines()[-LOG_LINES:]]
    return {
        "exit_code": data.get("exit_code"),
        "log_lines": "\n".join(lines),
        "in_setup": data.get("failed_in") == "setup",  # the job's setup, not its command
        "why": event.message,
    }


def no_offers_facts(event: JobEvent, job: Job) -> dict:
    req = job.requirements or {}
    return {
        "why": event.message,
        "gpus": ", ".join(req.get("gpu_names") or []) or "any GPU",
        "max_price_text": money(req["max_dph"], per_hour=True) if req.get("max_dph") else "",
    }


def generic_facts(event: JobEvent, job: Job) -> dict:
    """Budget and invoice events (and any later kind): the message and the event's data, its
    dollar amounts (keys ending ``_usd``) by the money rule, as the message writes them; an
    unknown value (no checkpoint yet) is left out rather than written "None"."""
    data = (event.data or {}).items()
    return {"items": [data_item(k, v) for k, v in data if v is not None]}


def data_item(key: str, value) -> tuple[str, object]:
    """One line of an event's data: ("spent", "$0.00820") for ``spent_usd``, else as stored."""
    if key.endswith("_usd") and isinstance(value, int | float) and not isinstance(value, bool):
        return key.removesuffix("_usd").replace("_", " "), money(value)
    return key.replace("_", " "), value


def budget_facts(event: JobEvent, job: Job) -> dict:
    """A budget warning or pause: the generic items, the share of the limit the event fired
    at, from its amounts as written ("82 %", the one its sentence quotes, never the 80 % or
    100 % marks), and, for a pause, who can raise the limit (the team's admins, by name)."""
    data = event.data or {}
    percent = data.get("percent_used")
    if percent is None and data.get("limit_usd") and data.get("spent_usd") is not None:
        percent = percent_of(data["spent_usd"], data["limit_usd"])
    return {**generic_facts(event, job), "percent": percent, "admins": admin_names(job.team)}


def resume_asked_facts(event: JobEvent, job: Job) -> dict:
    """A member's ask to resume: the sentence says who asked and why; the admins are named."""
    return {"items": [], "admins": admin_names(job.team)}


def needs_attention_facts(event: JobEvent, job: Job) -> dict:
    """The message names each field at fault and what to do: nothing to list beside it."""
    return {"items": []}


FACTS = {
    EventKind.NEEDS_ATTENTION: needs_attention_facts,
    EventKind.HOST_LOST: host_lost_facts,
    EventKind.RUNNING_AGAIN: running_again_facts,
    EventKind.FINISHED: finished_facts,
    EventKind.FAILED: failed_facts,
    EventKind.NO_OFFERS: no_offers_facts,
    EventKind.BUDGET_WARNING: budget_facts,
    EventKind.BUDGET_PAUSED: budget_facts,
    EventKind.RESUME_ASKED: resume_asked_facts,
}
