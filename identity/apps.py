from typing import Any

from django.apps import AppConfig


class IdentityConfig(AppConfig):
    name = "identity"
    verbose_name = "Identity"

    def ready(self) -> None:
        from identity import signals

        signals.connect()
        from portal import health

        # Single sign-on's state in /readyz (never makes the portal unready: password logins
        # and API tokens still work while the provider is away or misconfigured).
        health.add_readiness_note("oidc", _sso_status)


def _sso_status() -> dict[str, Any] | None:
    # Imported when /readyz asks: the OpenID client (JWT, requests) is not every process's.
    from identity import oidc

    return oidc.sso_status(check=True)
