"""Audit events for logins, failed logins and logouts."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.http import HttpRequest

from portal import audit


def _method(request: HttpRequest | None, user: Any) -> str:
    backend = getattr(user, "backend", "") or ""
    return "oidc" if backend.endswith("OIDCBackend") else "password"


def on_login(sender: Any, request: HttpRequest | None, user: Any, **_: Any) -> None:
    audit.record(
        action="login.success",
        actor=user,
        object_type="auth.user",
        object_id=str(user.pk),
        object_repr=f"{user.get_username()} ({_method(request, user)})",
    )


def on_logout(sender: Any, request: HttpRequest | None, user: Any, **_: Any) -> None:
    if user is None:
        return
    audit.record(
        action="logout",
        actor=user,
        object_type="auth.user",
        object_id=str(user.pk),
        object_repr=user.get_username(),
    )


def on_login_failed(
    sender: str, credentials: dict[str, Any], request: HttpRequest | None = None, **_: Any
) -> None:
    if "nonce" in credentials or "code_verifier" in credentials:
        return  # OpenID Connect failures are audited by the callback view, with the reason
    username = str(credentials.get("username", ""))[:150]
    audit.record(
        action="login.failed",
        object_type="auth.user",
        object_repr=f"password login as {username!r}",
    )


def connect() -> None:
    user_logged_in.connect(on_login, dispatch_uid="audit-login")
    user_logged_out.connect(on_logout, dispatch_uid="audit-logout")
    user_login_failed.connect(on_login_failed, dispatch_uid="audit-login-failed")
