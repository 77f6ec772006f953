from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "notify"
    verbose_name = "Notifications"

    def ready(self) -> None:
        """Every new job event may notify someone: jobs writes the event, notify listens (jobs
        never imports notify)."""
        from django.db.models.signals import post_save

        from jobs.models import JobEvent  # models are loaded only once apps are ready
        from notify.signals import queue_notifications

        post_save.connect(queue_notifications, sender=JobEvent, dispatch_uid="notify-job-event")
