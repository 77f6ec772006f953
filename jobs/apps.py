from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"

    def ready(self) -> None:
        from celery.signals import worker_ready

        from jobs.checkpoints import late_write_refusal
        from nomadgpu.storage import install_write_guard

        worker_ready.connect(_enforce_on_worker_start, weak=False)
        # The local store's PUTs must stop landing once the attempt that got the URL is over.
        install_write_guard(late_write_refusal)


def _enforce_on_worker_start(**_kwargs) -> None:
    """A worker that was down missed budget passes: run one at once, not at the next beat."""
    from jobs.tasks import enforce_budgets  # tasks import every app's models: not at load

    enforce_budgets.delay()
