from django.apps import AppConfig


class NomadgpuConfig(AppConfig):
    name = "nomadgpu"
    verbose_name = "Teams and supervisor"

    def ready(self) -> None:
        from nomadgpu import checks, signals  # noqa: F401  (registers checks and receivers)
