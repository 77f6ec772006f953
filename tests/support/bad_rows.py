"""Rows broken the way a real installation breaks them, for the tests of one bad row."""

from __future__ import annotations

from django.db import connection

from nomadgpu import crypto
from nomadgpu.models import Team


def poison_vast_key(team: Team) -> None:
    """Store a Vast key that no configured key opens (a rotation that dropped its key): it is
    sealed for another column, so it fails authentication here."""
    wrong = crypto.seal("vast-key", context="nomadgpu.team.telegram_bot_token")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE nomadgpu_team SET vast_api_key = %s WHERE id = %s", [wrong, team.pk])
