from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        """Answer jobs' spending questions from now on (``jobs.spending``)."""
        from billing.gate import BudgetGate  # it reads the models: only once apps are loaded
        from jobs import spending

        spending.install(BudgetGate())
