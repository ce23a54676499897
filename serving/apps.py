from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "serving"
    verbose_name = "Endpoints"

    def ready(self) -> None:
        from django.conf import settings

        from portal.body_limits import BODY_LIMITS
        from runs.submission import MAX_SUBMISSION_BYTES

        # A request invoked through the proxy may be larger than Django's limit for JSON
        # bodies (TAU_ENDPOINT_MAX_BODY_BYTES; the view streams it, never holding it whole).
        BODY_LIMITS["api:endpoint-invoke"] = lambda method: (
            int(settings.TAU_ENDPOINT_MAX_BODY_BYTES) if method == "POST" else None
        )
        # A deployment is a submission's form: a project zip and a tau.yaml (a JSON one is
        # held to Django's limit by the view itself).
        BODY_LIMITS["api:endpoint-list"] = lambda method: (
            MAX_SUBMISSION_BYTES if method == "POST" else None
        )
