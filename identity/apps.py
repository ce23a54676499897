from django.apps import AppConfig


class IdentityConfig(AppConfig):
    name = "identity"
    verbose_name = "Identity"

    def ready(self) -> None:
        from identity import schema, signals  # noqa: F401 - schema registers itself

        signals.connect()
        from identity import oidc
        from portal import health

        # Single sign-on's state in /readyz (never makes the portal unready: password logins
        # and API tokens still work while the provider is away or misconfigured).
        health.add_readiness_note("oidc", lambda: oidc.sso_status(check=True))
