from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "TauGrid portal"

    def ready(self) -> None:
        from portal import audit

        audit.connect_signals()
