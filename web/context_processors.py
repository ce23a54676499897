"""Template context every page needs: the workspaces for the navigation switcher."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from workspaces.selectors import navigation_workspaces


def navigation(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav_workspaces": []}
    # Lazy: pages that never show the switcher (errors, login) never run the query.
    return {"nav_workspaces": SimpleLazyObject(lambda: navigation_workspaces(request))}
