"""The cast (two teams; admin, member, finance, outsider) and process helpers for all tests."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

# The helpers' asserts report their values as a test's do (helpers that lived in test modules and
# conftests were rewritten there); this must run before anything imports tests.support.
pytest.register_assert_rewrite("tests.support")

from django.conf import settings  # noqa: E402

from nomadgpu.models import Role  # noqa: E402
from tests.support.factories import MembershipFactory, TeamFactory, UserFactory  # noqa: E402

# The Hugging Face Trainer test needs torch, which only `make test-hf` installs; it sets this.
collect_ignore = [] if os.environ.get("NOMADGPU_TEST_HF") else ["hf"]

# `make test` sets a throwaway key; this covers a plain `pytest` run the same way.
TEST_FIELD_KEY = "dGVzdC1vbmx5LWtleS10ZXN0LW9ubHkta2V5LTMyYnk="
os.environ.setdefault("FIELD_ENCRYPTION_KEY", TEST_FIELD_KEY)
if not settings.FIELD_ENCRYPTION_KEYS:
    settings.FIELD_ENCRYPTION_KEYS = [os.environ["FIELD_ENCRYPTION_KEY"]]
# Every cast member gets a password; PBKDF2's million rounds made each test's setup take ~3 s (the
# four users of the cast), more than half of the suite. Only tests check passwords here, and no
# subprocess started by a test logs anyone in, so a fast hasher changes nothing they prove.
settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

pytest_plugins = [
    "tests.support.agent_runs",
    "tests.support.processes",
    "tests.support.s3",
    "tests.support.sandbox",
    "tests.support.staging",
    "tests.support.vast_billing_fake",
]


@dataclass
class Cast:
    team_a: object
    team_b: object
    admin: object  # team admin of A
    member: object  # member of A
    finance: object  # finance in A
    outsider: object  # member of B only


@pytest.fixture
def cast(db) -> Cast:
    team_a = TeamFactory(name="Team A", slug="team-a")
    team_b = TeamFactory(name="Team B", slug="team-b")
    admin = MembershipFactory(team=team_a, role=Role.ADMIN, user__username="alice").user
    member = MembershipFactory(team=team_a, role=Role.MEMBER, user__username="bob").user
    finance = MembershipFactory(team=team_a, role=Role.FINANCE, user__username="fran").user
    outsider = MembershipFactory(team=team_b, role=Role.ADMIN, user__username="olga").user
    for user in (admin, member, finance, outsider):
        user.refresh_from_db()
    return Cast(team_a, team_b, admin, member, finance, outsider)


@pytest.fixture
def user_factory():
    return UserFactory


# Fixtures that reach the database (directly or through the cast, the live server, a worker).
DATABASE_FIXTURES = frozenset(
    {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback"}
)


def pytest_collection_modifyitems(config, items) -> None:
    """Mark every test that touches the database (and so the broker, which only such tests use)
    ``needs_db``, from its fixtures and ``django_db`` marker: CI runs the rest only once.

    Tests marked ``needs_postgres`` cut a PostgreSQL connection under the supervisor; on the
    embedded SQLite there is no connection to cut, so they are deselected there (reported as
    deselected, as ``-m`` would), and run in the PostgreSQL pass of ``make test``."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & DATABASE_FIXTURES or item.get_closest_marker("django_db"):
            item.add_marker(pytest.mark.needs_db)
    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        return
    kept = [item for item in items if not item.get_closest_marker("needs_postgres")]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
