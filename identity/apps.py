from django.apps import AppConfig


class IdentityConfig(AppConfig):
    name = "identity"
    verbose_name = "Identity"

    def ready(self) -> None:
        from identity import schema, signals  # noqa: F401 - schema registers itself

        signals.connect()
