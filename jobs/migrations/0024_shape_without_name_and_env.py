"""Job shapes keyed on the program and its GPUs only (``jobs.models.shape_of``): the name and
the env no longer part the runs of one job, so the stored keys are made again."""

import hashlib
import json

from django.db import migrations


def _shape(job) -> str:
    # A frozen copy of jobs.models.shape_of as this migration found it, so that jobs submitted
    # before it learn from and teach the runs after it.
    try:
        gpus = int((job.requirements or {}).get("num_gpus") or 1)
    except (TypeError, ValueError, AttributeError):
        gpus = 1
    parts = [job.image, job.command, job.setup, gpus]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def fill_shapes(apps, schema_editor):
    Job = apps.get_model("jobs", "Job")
    for job in Job.objects.only("image", "command", "setup", "requirements").iterator():
        Job.objects.filter(pk=job.pk).update(shape=_shape(job))


class Migration(migrations.Migration):
    dependencies = [("jobs", "0023_drills_and_training_again")]

    # Backwards leaves the keys as they are: the code of that time recomputes a job's key
    # whenever it saves the job.
    operations = [migrations.RunPython(fill_shapes, migrations.RunPython.noop)]
