"""Channels that take budget pauses also take the asks to resume them (``resume_asked``, new):
a channel's kinds are stored as a list, so a kind added later reaches only new channels
unless it is added to the existing ones here."""

from django.db import migrations

NEW, ALONGSIDE = "resume_asked", "budget_paused"


def add_kind(apps, schema_editor):
    Channel = apps.get_model("notify", "Channel")
    for channel in Channel.objects.all():
        kinds = list(channel.event_kinds or [])
        if ALONGSIDE in kinds and NEW not in kinds:
            channel.event_kinds = [*kinds, NEW]
            channel.save(update_fields=["event_kinds"])


def remove_kind(apps, schema_editor):
    Channel = apps.get_model("notify", "Channel")
    for channel in Channel.objects.all():
        kinds = list(channel.event_kinds or [])
        if NEW in kinds:
            channel.event_kinds = [k for k in kinds if k != NEW]
            channel.save(update_fields=["event_kinds"])


class Migration(migrations.Migration):
    dependencies = [("notify", "0001_initial")]

    operations = [migrations.RunPython(add_kind, remove_kind)]
