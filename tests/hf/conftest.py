"""Fixtures shared by the Hugging Face tests (collected only under ``make test-hf``)."""

from __future__ import annotations

import pytest

from tests.support.agent_fake_supervisor import FakeS3


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server, one per module: starting it is most of a short test's time."""
    server = FakeS3()
    yield server
    server.close()


# The whole supervisor against the sandbox (tests/e2e/conftest.py), for the template that runs
# the tiny QLoRA there: a live web process, a worker, watchdog ticks, the real agent.
from tests.e2e.conftest import (  # noqa: E402, F401
    celery_worker_thread,
    pytest_configure,
    sandbox,
    supervisor,
)

# The fake Hub and the storage backends of the staging tests (tests/test_staging.py).
from tests.test_staging import backend, hub  # noqa: E402, F401
