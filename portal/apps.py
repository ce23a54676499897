from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "TauGrid portal"

    def ready(self) -> None:
        from portal import audit
        from portal.identity import schema, signals  # noqa: F401 - schema registers itself

        audit.connect_signals()
        signals.connect()
