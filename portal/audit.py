"""The audit trail: who changed what, when, from where, with the state before and after.

Changes are recorded from model signals, so a change made in the Django admin, through the
API or by a service is recorded the same way, in the same transaction as the change itself.
Models opt in by inheriting :class:`AuditedModel`. Events that are not model changes (logins,
token use) are written with :func:`record`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models.signals import post_delete, post_save, pre_delete, pre_save

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
    from django.http import HttpRequest

    from workspaces.models import Workspace


@dataclass(frozen=True)
class AuditContext:
    source: str
    request: HttpRequest | None = None
    actor: AbstractBaseUser | None = None

    def resolve_actor(self) -> AbstractBaseUser | AnonymousUser | None:
        if self.actor is not None:
            return self.actor
        if self.request is not None:
            return getattr(self.request, "user", None)
        return None


_context: ContextVar[AuditContext | None] = ContextVar("audit_context", default=None)


@contextmanager
def request_context(request: HttpRequest, *, source: str) -> Iterator[None]:
    token = _context.set(AuditContext(source=source, request=request))
    try:
        yield
    finally:
        _context.reset(token)


@contextmanager
def acting_as(actor: AbstractBaseUser | None, *, source: str) -> Iterator[None]:
    """Attribute changes made inside the block to ``actor`` (None: the system itself)."""
    token = _context.set(AuditContext(source=source, actor=actor))
    try:
        yield
    finally:
        _context.reset(token)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


class AuditedModel(models.Model):
    """A model whose every create, update and delete becomes an :class:`AuditEvent`.

    The state as loaded from the database is remembered on the instance, so an update
    records a real before/after without an extra query.
    """

    audit_exclude: tuple[str, ...] = ()
    # State kept on instances between signals (not database fields).
    _audit_loaded: dict[str, Any] | None
    _audit_workspace: Workspace | None
    _audit_repr: str

    class Meta:
        abstract = True

    @classmethod
    def from_db(cls, db: str | None, field_names: Any, values: Any) -> Any:
        instance = super().from_db(db, field_names, values)
        instance._audit_loaded = instance.audit_snapshot()
        return instance

    def audit_snapshot(self) -> dict[str, Any]:
        snapshot: dict[str, Any] = {}
        for field in self._meta.concrete_fields:
            if field.name in self.audit_exclude:
                continue
            if field.attname not in self.__dict__:
                continue  # deferred, not loaded: unknown rather than wrong
            value = field.value_from_object(self)
            if isinstance(field, models.DecimalField) and isinstance(value, Decimal):
                # As stored: Decimal("4") assigned in memory and "4.000" loaded are the same.
                value = value.quantize(Decimal(1).scaleb(-field.decimal_places))
            snapshot[field.name] = value
        jsonable: dict[str, Any] = _jsonable(snapshot)
        return jsonable

    def audit_workspace(self) -> Workspace | None:
        """The workspace this object belongs to, for scoping the audit log."""
        return None


def record(
    *,
    action: str,
    workspace: Workspace | None = None,
    object_type: str = "",
    object_id: str = "",
    object_repr: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    actor: AbstractBaseUser | AnonymousUser | None = None,
) -> models.Model:
    """Write one audit event with the current request context."""
    from portal.models import AuditEvent

    context = _context.get() or AuditContext(source="system")
    if actor is None:
        actor = context.resolve_actor()
    request = context.request
    user = actor if actor is not None and actor.is_authenticated else None
    return AuditEvent.objects.create(
        action=action,
        source=context.source,
        actor_id=getattr(user, "pk", None),
        actor_username=user.get_username() if user is not None else "",
        workspace_id=getattr(workspace, "pk", None),
        workspace_slug=getattr(workspace, "slug", ""),
        object_type=object_type,
        object_id=object_id,
        object_repr=object_repr[:200],
        before=before,
        after=after,
        request_id=getattr(request, "request_id", "") if request is not None else "",
        remote_addr=request.META.get("REMOTE_ADDR") if request is not None else None,
    )


def _object_type(instance: models.Model) -> str:
    return f"{instance._meta.app_label}.{instance._meta.model_name}"


def _on_pre_save(sender: type[models.Model], instance: AuditedModel, **_: Any) -> None:
    if instance._state.adding or hasattr(instance, "_audit_loaded"):
        return
    # Saved without having been loaded (built with a pk, say): read what is there now.
    current = type(instance)._base_manager.filter(pk=instance.pk).first()
    instance._audit_loaded = current.audit_snapshot() if isinstance(current, AuditedModel) else None


def _on_save(sender: type[models.Model], instance: AuditedModel, created: bool, **_: Any) -> None:
    after = instance.audit_snapshot()
    before: dict[str, Any] | None = None if created else getattr(instance, "_audit_loaded", None)
    if before is None:
        action = "create"
    else:
        action = "update"
        changed = sorted(key for key in after if before.get(key) != after.get(key))
        if not changed:
            return  # saved without a change: nothing happened worth recording
        before = {key: before.get(key) for key in changed}
        after = {key: after[key] for key in changed}
    record(
        action=action,
        workspace=instance.audit_workspace(),
        object_type=_object_type(instance),
        object_id=str(instance.pk),
        object_repr=str(instance),
        before=before,
        after=after,
    )
    instance._audit_loaded = instance.audit_snapshot()


def _on_pre_delete(sender: type[models.Model], instance: AuditedModel, **_: Any) -> None:
    # After a cascade the parent workspace row is gone; look it up while it still exists.
    # Likewise its description may name related rows the cascade deletes.
    instance._audit_workspace = instance.audit_workspace()
    instance._audit_repr = str(instance)


def _on_delete(sender: type[models.Model], instance: AuditedModel, **_: Any) -> None:
    record(
        action="delete",
        workspace=getattr(instance, "_audit_workspace", None),
        object_type=_object_type(instance),
        object_id=str(instance.pk),
        object_repr=getattr(instance, "_audit_repr", ""),
        before=instance.audit_snapshot(),
        after=None,
    )


def connect_signals() -> None:
    from django.apps import apps

    for model in apps.get_models():
        if issubclass(model, AuditedModel):
            pre_save.connect(_on_pre_save, sender=model, dispatch_uid=f"audit-pre-{model.__name__}")
            post_save.connect(_on_save, sender=model, dispatch_uid=f"audit-save-{model.__name__}")
            pre_delete.connect(
                _on_pre_delete, sender=model, dispatch_uid=f"audit-pre-delete-{model.__name__}"
            )
            post_delete.connect(
                _on_delete, sender=model, dispatch_uid=f"audit-delete-{model.__name__}"
            )
