from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"

    def ready(self) -> None:
        from jobs.checkpoints.records import late_write_refusal
        from jobs.code.packs import write_refusal as pack_write_refusal
        from nomadgpu.storage import install_write_guard

        # The local store's PUTs must stop landing once the attempt that got the URL is over,
        # and a code pack's object may be written only while that pack is uploading.
        install_write_guard(lambda key: late_write_refusal(key) or pack_write_refusal(key))
