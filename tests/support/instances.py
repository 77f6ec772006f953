"""The sandbox account's instances as Vast lists them: now, and over a whole test (the most that
existed at once per job, the proof that a job never had two hosts billing together)."""

from __future__ import annotations

import threading

from django.conf import settings

from hosts.vast import RetryPolicy, VastClient, VastError
from jobs.models import Job
from tests.support.sandbox import DEFAULT_KEY


class InstanceWatch:
    """Lists the sandbox account's instances in a thread, every 50 ms, for the whole test, and
    keeps the largest number of instances that existed at once per label prefix: the way to
    prove that a job never had two hosts billing at the same time."""

    def __init__(self, sandbox) -> None:
        self.sandbox = sandbox
        self.peak: dict[str, int] = {}
        self.seen: dict[int, str] = {}  # every instance id ever listed -> its label
        self.errors = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with VastClient(DEFAULT_KEY, self.sandbox.url, retry=RetryPolicy(attempts=1)) as client:
            while not self.stop.wait(0.05):
                try:
                    instances = client.list_instances()
                except VastError:
                    self.errors += 1
                    continue
                counts: dict[str, int] = {}
                for inst in instances:
                    self.seen[inst.id] = inst.label or ""
                    prefix = (inst.label or "").rsplit(":", 1)[0]
                    counts[prefix] = counts.get(prefix, 0) + 1
                for prefix, count in counts.items():
                    self.peak[prefix] = max(self.peak.get(prefix, 0), count)

    def job_prefix(self, job: Job) -> str:
        return f"ngpu:{settings.NOMADGPU_ENV}:{job.pk}"

    def peak_for(self, job: Job) -> int:
        return self.peak.get(self.job_prefix(job), 0)

    def ids_for(self, job: Job) -> set[int]:
        prefix = self.job_prefix(job) + ":"
        return {i for i, label in self.seen.items() if label.startswith(prefix)}

    def __enter__(self) -> InstanceWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def live_instances(sandbox, job: Job | None = None) -> list:
    """The sandbox account's instances now (those of JOB's labels, when given)."""
    with VastClient(DEFAULT_KEY, sandbox.url) as client:
        instances = client.list_instances()
    if job is None:
        return instances
    prefix = f"ngpu:{settings.NOMADGPU_ENV}:{job.pk}:"
    return [i for i in instances if (i.label or "").startswith(prefix)]
