from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        """Answer jobs' spending questions from now on (``jobs.spending``), and run a budget
        pass whenever a worker starts."""
        from celery.signals import worker_ready

        from billing.gate import BudgetGate  # it reads the models: only once apps are loaded
        from jobs import spending

        spending.install(BudgetGate())
        worker_ready.connect(_enforce_on_worker_start, weak=False)


def _enforce_on_worker_start(**_kwargs) -> None:
    """A worker that was down missed budget passes: run one at once, not at the next beat."""
    from billing.tasks import enforce_budgets  # tasks import every app's models: not at load

    enforce_budgets.delay()
