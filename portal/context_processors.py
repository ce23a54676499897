"""Template context every page needs: the workspaces for the navigation switcher."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from workspaces.selectors import workspaces_for_user


def user_workspaces(request: HttpRequest) -> list[Any]:
    """The caller's workspaces, read once per request however many parts of a page ask."""
    cached: list[Any] | None = getattr(request, "_tau_user_workspaces", None)
    if cached is None:
        cached = list(workspaces_for_user(request.user))
        request._tau_user_workspaces = cached  # type: ignore[attr-defined]
    return cached


def navigation(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav_workspaces": []}
    # Lazy: pages that never show the switcher (errors, login) never run the query.
    return {"nav_workspaces": SimpleLazyObject(lambda: user_workspaces(request))}
