from tests.notifications.helpers import endpoint, notify_settings, smtp, tls_endpoint, trickler

__all__ = ["endpoint", "notify_settings", "smtp", "tls_endpoint", "trickler"]
