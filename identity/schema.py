"""Describes TauGrid's bearer tokens in the OpenAPI schema. Imported by the schema's views
(web/api_docs.py), which every schema generation reaches through the URLconf, and not at
start-up: drf-spectacular brings django.test and Jinja2 with it, a third of the start-up time
of every process that never builds a schema (Celery workers, the local agent, commands)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "identity.tokens.BearerTokenAuthentication"
    name = "tauToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "tau_<key>_<secret>",
            "description": (
                "An API token from the portal's API tokens page or manage.py create_token."
            ),
        }
