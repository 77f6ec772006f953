from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from jobs.drill import DrillError, drill_once
from jobs.models import Job
from nomadgpu.humanize import duration


class Command(BaseCommand):
    help = (
        "Fire drill: destroy JOB_ID's current host on purpose and print, from the loss, when it "
        "was detected, back on a machine and training again, and the checkpoint step it "
        "resumed from. Needs a worker and beat."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("job_id", type=int)
        parser.add_argument("--times", type=int, default=1)
        parser.add_argument("--timeout", type=float, default=900, help="seconds per drill")

    def handle(self, *args, job_id: int, times: int, timeout: float, **options) -> None:
        job = Job.objects.filter(pk=job_id).first()
        if job is None:
            raise CommandError(f"no job {job_id}")
        for n in range(1, times + 1):
            try:
                result = drill_once(job, timeout_s=timeout, say=self.stdout.write)
            except DrillError as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(
                f"drill {n}/{times} (from the loss, the last heartbeat): detected after "
                f"{duration(result.detection_s)}, back on a machine after "
                f"{duration(result.back_on_machine_s)}, training again after "
                f"{duration(result.training_again_s)}, resumed from step {result.resumed_step}"
                + (f"; {result.resume_note}" if result.resume_note else "")
            )
