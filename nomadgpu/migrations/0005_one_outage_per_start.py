"""One outage per start. Rows recorded twice by the race this closes (the web's beacon and the
watchdog at once) are merged first: the one that ended last is kept, as it spans both."""

from django.db import migrations, models


def merge_twice_recorded(apps, schema_editor):
    IngestOutage = apps.get_model("nomadgpu", "IngestOutage")
    starts = (
        IngestOutage.objects.values("started_at")
        .annotate(n=models.Count("id"))
        .filter(n__gt=1)
        .values_list("started_at", flat=True)
    )
    for started_at in list(starts):
        rows = list(IngestOutage.objects.filter(started_at=started_at))
        # Open (None) outranks any end: it is still going on.
        rows.sort(key=lambda r: (r.ended_at is None, r.ended_at or r.started_at), reverse=True)
        IngestOutage.objects.filter(pk__in=[r.pk for r in rows[1:]]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("nomadgpu", "0004_team_secrets"),
    ]

    operations = [
        migrations.RunPython(merge_twice_recorded, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="ingestoutage",
            constraint=models.UniqueConstraint(fields=("started_at",), name="one_outage_per_start"),
        ),
    ]
