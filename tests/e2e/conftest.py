"""The whole supervisor against the sandbox (``tests/support/supervisor.py``), with the budget
enforcer at the e2e cadence and the toy trainer's uninterrupted digest."""

from __future__ import annotations

import pytest

from tests.support.supervisor import (  # noqa: F401
    celery_worker_thread,
    passing,
    pytest_configure,
    sandbox,
    supervisor,
)
from tests.support.toy import TOY_ENV, toy_digest


@pytest.fixture
def enforcer(supervisor):  # noqa: F811
    """Stands in for beat's budget-enforce entry at the e2e cadence, run in a thread of its own
    as production's worker pool runs it beside other tasks. Sent through the broker, each pass
    queued behind every watchdog tick, rent and destroy on the test's one solo worker thread,
    and a loaded machine spaced passes out by many seconds (beat's schedule reaching a worker
    is proven in tests/test_celery_broker.py)."""
    from billing.tasks import enforce_budgets

    with passing(enforce_budgets):
        yield


@pytest.fixture(scope="session")
def uninterrupted_digest() -> str:
    """The toy trainer's final digest without any interruption (the reference)."""
    return toy_digest(TOY_ENV)
