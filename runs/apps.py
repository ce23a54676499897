from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"

    def ready(self) -> None:
        from functools import partial

        from django.conf import settings

        from portal import health
        from runs.backends import registry

        # Each backend says what it adds to /readyz ("local_executor": the agent's sandbox).
        for name in settings.TAU_BACKEND_CLASSES:
            health.add_readiness_note(f"{name}_executor", partial(registry.readiness_note, name))
