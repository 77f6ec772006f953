from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        from celery.signals import worker_ready

        worker_ready.connect(_enforce_on_worker_start, weak=False)


def _enforce_on_worker_start(**_kwargs) -> None:
    """A worker that was down missed ticks: enforce the limits at once, not at the next beat."""
    from billing.tasks import enforce_budgets

    enforce_budgets.delay()
