from __future__ import annotations

from django.contrib import admin

from hosts.models import Machine


@admin.register(Machine)
class MachineAdmin(admin.ModelAdmin):
    list_display = [
        "machine_id",
        "gpu_name",
        "num_gpus",
        "geolocation",
        "rentals",
        "interruptions",
        "observed_speed_factor",
        "last_seen_at",
    ]
    list_filter = ["provider", "gpu_name"]
    search_fields = ["machine_id", "host_id", "gpu_name", "geolocation"]
