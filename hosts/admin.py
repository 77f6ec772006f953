from __future__ import annotations

from django.contrib import admin
from django.utils import timezone

from hosts.models import Machine, MachineRental
from hosts.selection import machine_memory as mm


def memory_summary(machine: Machine) -> str:
    """The team's memory of MACHINE now, in one line: its record's words, the chance its next
    start fails (at its last offer's reliability), its losses per hour rented and its ban."""
    record = machine.memory_at(timezone.now())
    if not record.rentals:
        return "no ended rental in the last 90 days"
    p = mm.start_failure_p(record, machine.reliability)
    parts = [
        mm.memory_words(*mm.memory_parts(record)),
        f"P(fail to start) {p:.0%} (reliability {machine.reliability or 'unknown'})",
        f"{record.losses:.1f} losses in {record.running_h:.1f} h running (decayed)",
    ]
    if record.banned_until is not None:
        parts.append(f"set aside until {record.banned_until:%Y-%m-%d %H:%M} UTC")
    return "; ".join(parts)


class RentalInline(admin.TabularInline):
    """A machine's rentals, newest first: what each showed the team's memory."""

    model = MachineRental
    extra = 0
    can_delete = False
    fields = readonly_fields = [
        "attempt_id",
        "racer_id",
        "rented_at",
        "ready_at",
        "ended_at",
        "incident",
        "cause",
        "excused",
        "outbids",
        "seconds_per_step",
        "promised_seconds_per_step",
        "down_mbps",
        "advertised_down_mbps",
    ]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Machine)
class MachineAdmin(admin.ModelAdmin):
    list_display = [
        "machine_id",
        "gpu_name",
        "num_gpus",
        "geolocation",
        "rentals",
        "interruptions",
        "team_memory",
        "last_seen_at",
    ]
    list_filter = ["provider", "gpu_name"]
    search_fields = ["machine_id", "host_id", "gpu_name", "geolocation"]
    readonly_fields = ["team_memory"]
    inlines = [RentalInline]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("rental_records")

    @admin.display(description="team memory (half-life 14 d)")
    def team_memory(self, machine: Machine) -> str:
        return memory_summary(machine)


@admin.register(MachineRental)
class MachineRentalAdmin(admin.ModelAdmin):
    """Every rental the team's memory weighs; filter by incident to list the incidents, and by
    "excused" to see those not charged to their machine and why."""

    list_display = [
        "attempt_id",
        "racer_id",
        "machine",
        "rented_at",
        "ready_at",
        "ended_at",
        "incident",
        "cause",
        "excused",
    ]
    list_filter = ["incident", ("excused", admin.EmptyFieldListFilter)]
    search_fields = ["machine__machine_id", "attempt_id", "racer_id", "cause"]
    list_select_related = ["machine"]
    readonly_fields = [f.name for f in MachineRental._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False
