from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"

    def ready(self) -> None:
        from celery.signals import worker_ready

        worker_ready.connect(_enforce_on_worker_start, weak=False)


def _enforce_on_worker_start(**_kwargs) -> None:
    """A worker that was down missed budget passes: run one at once, not at the next beat."""
    from jobs.tasks import enforce_budgets  # tasks import every app's models: not at load

    enforce_budgets.delay()
