from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"

    def ready(self) -> None:
        from portal import health
        from runs.health import local_executor_warning

        health.add_readiness_note("local_executor", local_executor_warning)
