"""Fixtures shared by the Hugging Face tests (collected only under ``make test-hf``).

The module's fake S3 (``s3``), the fake Hub and the storage backends (``hub``, ``backend``)
come from the suite's plugins (``tests.support.agent_runs``, ``tests.support.staging``)."""

from __future__ import annotations

# The whole supervisor against the sandbox (tests/support/supervisor.py), for the template that
# runs the tiny QLoRA there: a live web process, a worker, watchdog ticks, the real agent.
from tests.support.supervisor import (  # noqa: F401
    celery_worker_thread,
    pytest_configure,
    sandbox,
    supervisor,
)
