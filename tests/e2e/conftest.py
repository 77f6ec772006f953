"""The whole supervisor against the sandbox (``tests/support/supervisor.py``), with the budget
enforcer at the e2e cadence and the toy trainer's uninterrupted digest."""

from __future__ import annotations

import pytest

from tests.support.supervisor import (  # noqa: F401
    beating,
    celery_worker_thread,
    pytest_configure,
    sandbox,
    supervisor,
)
from tests.support.toy import TOY_ENV, toy_digest


@pytest.fixture
def enforcer(supervisor):  # noqa: F811
    """Stands in for beat's budget-enforce entry at the e2e cadence (through the broker)."""
    from billing.tasks import enforce_budgets

    with beating(enforce_budgets):
        yield


@pytest.fixture(scope="session")
def uninterrupted_digest() -> str:
    """The toy trainer's final digest without any interruption (the reference)."""
    return toy_digest(TOY_ENV)
