from django.apps import AppConfig


class PortalConfig(AppConfig):
    """The people-facing layer: job pages, the dashboard and the member API. It reads every app
    below it (jobs, billing) and nothing imports it, so a page may show any app's numbers."""

    name = "portal"
    label = "portal"
