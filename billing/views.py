"""Finance views: what Vast billed against what NomadGPU recorded, per period and per job.

Finance and admins of a team only: a member gets 403, an outsider 404 (the team's existence is
not revealed). Pages work without JavaScript; with htmx, filters swap only the job table and a
review swaps only its flag row.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import UTC, date

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST
from kombu.exceptions import OperationalError

from billing import invoices, reconcile, tasks
from billing.models import Charge, DiscrepancyFlag, FlagStatus, Payment
from billing.reconcile import Status
from jobs.models import Job
from nomadgpu.models import Team
from nomadgpu.permissions import can_see_billing, get_team_for_member_or_404

STATUS_CHOICES = [("", "any status")] + [
    (s, Status.LABELS[s])
    for s in (
        Status.OVER_BILLED,
        Status.UNDER_BILLED,
        Status.UNBILLED_USAGE,
        Status.MATCHED,
        Status.PENDING,
    )
]


def finance_team(request, slug: str) -> Team:
    """The team if the user may see its billing; 404 for outsiders, 403 for plain members."""
    team = get_team_for_member_or_404(request.user, slug)
    if not can_see_billing(request.user, team):
        raise PermissionDenied("Billing is visible to the team's finance and admin roles.")
    return team


class PeriodForm(forms.Form):
    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    status = forms.ChoiceField(required=False, choices=STATUS_CHOICES)
    q = forms.CharField(required=False, max_length=120, label="Job name")

    def clean(self):
        data = super().clean()
        if data.get("start") and data.get("end") and data["start"] > data["end"]:
            raise forms.ValidationError("The period starts after it ends.")
        return data


@dataclass(frozen=True)
class Filters:
    start: date
    end: date
    status: str
    q: str


def read_filters(request) -> tuple[PeriodForm, Filters]:
    """The period (default: this calendar month so far, UTC days) and the job filters."""
    form = PeriodForm(request.GET or None)
    today = timezone.now().astimezone(UTC).date()
    data = form.cleaned_data if form.is_bound and form.is_valid() else {}
    start = data.get("start") or today.replace(day=1)
    end = data.get("end") or today
    return form, Filters(start, end, data.get("status") or "", (data.get("q") or "").strip())


def filtered_jobs(report: reconcile.PeriodReport, filters: Filters) -> list:
    rows = report.jobs
    if filters.status:
        rows = [j for j in rows if j.status == filters.status]
    if filters.q:
        rows = [j for j in rows if filters.q.lower() in j.job.name.lower()]
    return rows


@login_required
def summary(request, slug: str):
    """The period summary, the per-job table (filters), unmatched charges, payments, flags."""
    team = finance_team(request, slug)
    form, filters = read_filters(request)
    report = reconcile.reconcile_period(team, filters.start, filters.end, now=timezone.now())
    context = {
        "team": team,
        "form": form,
        "filters": filters,
        "report": report,
        "jobs": filtered_jobs(report, filters),
        "query": request.GET.urlencode(),
    }
    if request.htmx:
        return render(request, "billing/finance_summary.html#job-table", context)
    lo, hi = reconcile.period_bounds(filters.start, filters.end)
    context.update(
        payments=Payment.objects.filter(team=team, created_at__gte=lo, created_at__lt=hi),
        flags=DiscrepancyFlag.objects.filter(team=team, status=FlagStatus.OPEN).select_related(
            "attempt__job", "charge"
        ),
        statuses=[(Status.LABELS[s], report.count(s)) for s, _ in STATUS_CHOICES[1:]],
        upload_form=UploadForm(),
        sync=getattr(team, "invoice_sync", None),
    )
    return render(request, "billing/finance_summary.html", context)


@login_required
def job_detail(request, slug: str, job_id: int):
    """One job: each attempt's components, its charges and their items, its flags."""
    team = finance_team(request, slug)
    job = get_object_or_404(Job.objects.select_related("team"), pk=job_id, team=team)
    row = reconcile.reconcile_job(job, now=timezone.now())
    flags = DiscrepancyFlag.objects.filter(attempt__job=job).select_related("attempt__job")
    return render(
        request,
        "billing/finance_job.html",
        {"team": team, "job": job, "row": row, "flags": flags},
    )


@login_required
def export(request, slug: str):
    """The per-attempt reconciliation of the period (with the same filters) as CSV."""
    team = finance_team(request, slug)
    _, filters = read_filters(request)
    report = reconcile.reconcile_period(team, filters.start, filters.end, now=timezone.now())
    response = HttpResponse(content_type="text/csv")
    name = f"nomadgpu-{team.slug}-{filters.start}-{filters.end}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    out = csv.writer(response)
    out.writerow(EXPORT_COLUMNS)
    for job in filtered_jobs(report, filters):
        for attempt in job.attempts:
            out.writerow(export_row(job, attempt))
    for charge in report.unmatched:
        out.writerow(
            ["", "", "", charge.source, Status.UNMATCHED_CHARGE, "0", f"{charge.amount:.4f}"]
            + [""] * (len(EXPORT_COLUMNS) - 7)
        )
    return response


EXPORT_COLUMNS = (
    "job_id",
    "job",
    "attempt",
    "source",
    "status",
    "recorded_usd",
    "billed_usd",
    "difference_usd",
    "difference_pct",
    *(f"{c}_{k}" for c, _, _ in reconcile.COMPONENTS for k in ("recorded_usd", "billed_usd")),
    "reason",
)


def export_row(job, row: reconcile.AttemptReconciliation) -> list[str]:
    attempt = row.attempt
    parts = [v for c in row.components for v in (f"{c.recorded:.4f}", f"{c.billed:.4f}")]
    return [
        str(job.job.pk),
        job.job.name,
        str(attempt.number),
        f"instance-{attempt.instance_id}" if attempt.instance_id else "",
        row.status,
        f"{row.recorded:.4f}",
        f"{row.billed:.4f}",
        f"{row.diff:.4f}",
        f"{row.pct:.1f}" if row.pct is not None and not row.pending else "",
        *parts,
        row.reason,
    ]


@login_required
def charges_csv(request, slug: str):
    """The period's imported charges in the upload format (``billing.invoices.CSV_COLUMNS``)."""
    team = finance_team(request, slug)
    _, filters = read_filters(request)
    charges = Charge.objects.filter(
        team=team, day__gte=filters.start, day__lte=filters.end
    ).prefetch_related("items")
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="charges-{team.slug}.csv"'
    csv.writer(response).writerows(invoices.export_rows(charges))
    return response


class UploadForm(forms.Form):
    file = forms.FileField(
        label="Charges CSV", help_text='Columns: see docs/invoices.md, "CSV upload".'
    )


@login_required
@require_POST
def upload(request, slug: str):
    """Import a charges CSV: all rows, or none and the bad rows' line numbers."""
    team = finance_team(request, slug)
    form = UploadForm(request.POST, request.FILES)
    if not form.is_valid():
        messages.error(request, "Choose a CSV file to upload.")
        return redirect("finance-summary", slug=team.slug)
    upload_file = form.cleaned_data["file"]
    if upload_file.size > invoices.CSV_MAX_BYTES:
        messages.error(request, "The file is larger than 10 MB; nothing was imported.")
        return redirect("finance-summary", slug=team.slug)
    now = timezone.now()
    try:
        result = invoices.import_csv(team, upload_file.read(), now=now)
    except invoices.CsvRejected as exc:
        context = {"team": team, "errors": exc.errors[:200], "total": len(exc.errors)}
        return render(request, "billing/finance_upload_rejected.html", context, status=400)
    reconcile.flag_discrepancies(team, now=now)
    messages.success(
        request,
        f"Imported {result.charges} charges ({result.items} items) over {result.days} days; "
        f"{result.matched} matched to attempts"
        + (
            f"; {result.skipped} rows of other teams' instances left out."
            if result.skipped
            else "."
        ),
    )
    return redirect("finance-summary", slug=team.slug)


@login_required
@require_POST
def import_now(request, slug: str):
    """Queue the team's invoice import now (finance or admin): the beat's own task, sent after
    the commit; the page then shows when it last ran and its last error."""
    team = finance_team(request, slug)
    try:
        tasks.queue_team_import(team.pk)
    except OperationalError as exc:  # the broker is down: say so rather than claim a queue
        messages.error(request, f"The import could not be queued: {exc}")
    else:
        messages.success(
            request,
            f"Import queued at {timezone.now():%H:%M:%S} UTC: a worker runs it within moments; "
            "reload to see it under Last import.",
        )
    return redirect("finance-summary", slug=team.slug)


class ReviewForm(forms.Form):
    note = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))


@login_required
@require_POST
def review_flag(request, slug: str, flag_id: int):
    """Mark a flag reviewed with a note (finance or admin)."""
    team = finance_team(request, slug)
    flag = get_object_or_404(DiscrepancyFlag, pk=flag_id, team=team)
    form = ReviewForm(request.POST)
    if form.is_valid():
        if not reconcile.mark_reviewed(
            flag, user=request.user, note=form.cleaned_data["note"], now=timezone.now()
        ):
            form.add_error(None, "Already reviewed.")
        flag.refresh_from_db()
    if request.htmx:
        status = 200 if form.is_valid() and not form.non_field_errors() else 400
        return render(
            request,
            "partials/finance_flag_row.html",
            {"team": team, "flag": flag, "form": form},
            status=status,
        )
    if not form.is_valid():
        messages.error(request, "A review needs a note.")
    return redirect("finance-summary", slug=team.slug)
