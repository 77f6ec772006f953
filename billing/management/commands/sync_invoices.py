"""``manage.py sync_invoices [--team SLUG]``: the beat's invoice import, run now in this process."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from billing.tasks import sync_team_invoices
from nomadgpu.models import Team


class Command(BaseCommand):
    help = (
        "Import Vast's charges and payments now, match them and flag discrepancies: the task "
        "the beat runs every INVOICE_SYNC_INTERVAL_S (idempotent; a re-run replaces, never "
        "doubles), for one team or every team."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--team", metavar="SLUG", help="only this team (default: every team)")

    def handle(self, *args, team: str | None, **options) -> None:
        """Every team (or TEAM) in turn; exit status 1 naming the teams whose import failed."""
        teams = Team.objects.order_by("slug")
        if team:
            teams = teams.filter(slug=team)
            if not teams.exists():
                raise CommandError(f"no team {team!r}")
        failed = [t.slug for t in teams if not self.sync(t)]
        if failed:
            raise CommandError(f"the import failed for {', '.join(failed)}")

    def sync(self, team: Team) -> bool:
        """One team's import, by the task's own code; False when it failed (the error is also
        on the team's InvoiceSync row, as the finance page shows it)."""
        try:
            result = sync_team_invoices(team.pk)  # the task body, run here, not sent
        except Exception as exc:  # one team's failure must not stop the others
            self.stderr.write(f"{team.slug}: failed: {exc}")
            return False
        self.stdout.write(
            f"{team.slug}: {result['days']} days, {result['charges']} charges "
            f"({result['items']} items), {result['payments']} payments, "
            f"{result['matched']} matched, {result['flags']} new flags"
        )
        return True
