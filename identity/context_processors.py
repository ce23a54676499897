"""Template context for staff: a banner on every page while single sign-on is misconfigured."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest

from identity import oidc


def sso_problem(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.is_staff:
        return {}
    status = oidc.sso_status()
    if status is None or status.get("status") != "misconfigured":
        return {}
    return {"sso_problem": status, "sso_provider_name": settings.TAU_OIDC_PROVIDER_NAME}
