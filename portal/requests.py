"""The signed-in user of a request, typed.

Views that act for someone (submit, cancel, issue a token) have already required a login,
but ``request.user`` is typed as "a user or anonymous": this says which, once, instead of a
``type: ignore`` at every call, and refuses rather than acting for an anonymous user.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from rest_framework.request import Request

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def signed_in_user(request: HttpRequest | Request) -> User:
    user = request.user
    if not user.is_authenticated:
        raise PermissionDenied("Log in first.")
    return user  # narrowed by is_authenticated: a User, not AnonymousUser
