"""Startup checks: a missing, malformed or wrong FIELD_ENCRYPTION_KEY stops every process.

Django runs system checks for ``runserver``, ``migrate`` and ``check``, and Celery's Django
fix-up runs them when a worker starts; ``wsgi.py`` calls ``verify_sealed_secrets_or_exit`` so
gunicorn refuses to start too.
"""

from __future__ import annotations

import sys

from django.core.checks import Error, Tags, Warning, register
from django.db import DatabaseError
from django.utils import timezone

from nomadgpu import crypto


def find_key_problem() -> str | None:
    """Why the configured key cannot serve, or None: missing/malformed key, or stored secrets
    that it cannot open (the wrong key, or a key dropped during a rotation)."""
    try:
        crypto.configured_keys()
    except crypto.KeyConfigError as exc:
        return str(exc)
    return _first_unreadable_secret()


def _first_unreadable_secret() -> str | None:
    """Try one stored value of every encrypted column (team keys, bot tokens, webhook secrets)."""
    from django.apps import apps

    from nomadgpu.fields import EncryptedTextField

    try:
        for model in apps.get_models():
            for field in model._meta.fields:
                if not isinstance(field, EncryptedTextField):
                    continue
                sealed = _raw_first(model, field.name)
                if sealed:
                    crypto.open_sealed(sealed, context=f"{model._meta.label_lower}.{field.name}")
    except crypto.SecretUnreadable as exc:
        return f"Stored secrets cannot be opened: {exc}"
    except DatabaseError:
        return None  # not migrated yet: nothing sealed to check
    return None


def _raw_first(model, field_name: str) -> str | None:
    """The stored (sealed) text of FIELD_NAME in one row, bypassing from_db_value."""
    from django.db import connection

    table = connection.ops.quote_name(model._meta.db_table)
    column = connection.ops.quote_name(model._meta.get_field(field_name).column)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} WHERE {column} <> '' LIMIT 1")  # noqa: S608
        row = cursor.fetchone()
    return row[0] if row else None


@register()
def encryption_key_check(app_configs=None, **kwargs) -> list[Error]:
    problem = find_key_problem()
    if problem is None:
        return []
    return [Error(problem, id="nomadgpu.E001")]


@register(Tags.database)
def watchdog_lag_check(app_configs=None, **kwargs) -> list[Warning]:
    """The watchdog is behind while it should be ticking (``nomadgpu.health``'s rule: only
    while beat is up, so a restart before beat has run is quiet)."""
    from nomadgpu.health import watchdog_lag_problem

    try:
        problem = watchdog_lag_problem(now=timezone.now())
    except DatabaseError:
        return []  # not migrated yet: nothing has ticked
    if problem is None:
        return []
    hint = (
        "Lost hosts are not being noticed. Check that exactly one `celery beat` runs, that a "
        "worker consumes the broker, and their logs; a stopped supervisor shows this too."
    )
    return [Warning(problem, hint=hint, id="nomadgpu.W010")]


def verify_sealed_secrets_or_exit() -> None:
    problem = find_key_problem()
    if problem:
        sys.stderr.write(f"NomadGPU cannot start: {problem}\n")
        raise SystemExit(2)
