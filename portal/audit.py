"""The audit trail: who changed what, when, from where, with the state before and after.

Changes are recorded from model signals, so a change made in the Django admin, through the
API or by a service is recorded the same way, in the same transaction as the change itself.
Models opt in by inheriting :class:`AuditedModel`. Events that are not model changes (logins,
token use) are written with :func:`record`. :func:`describe_changes` turns an event's
before/after into what people read: the fields that changed, old → new.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models.signals import post_delete, post_save, pre_delete, pre_save

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
    from django.http import HttpRequest

    from portal.models import AuditEvent


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
    _audit_workspace: models.Model | None
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
            snapshot[field.name] = self.audit_value(field, field.value_from_object(self))
        jsonable: dict[str, Any] = _jsonable(snapshot)
        return jsonable

    def audit_value(self, field: models.Field[Any, Any], value: Any) -> Any:
        """How one field's value is written into the audit log (then made JSON).

        Models override this to record a value the way people write it, e.g. a quota's
        amount as the Kubernetes quantity ``"4Gi"`` rather than ``"4294967296.000"``.
        """
        if isinstance(field, models.DecimalField) and isinstance(value, Decimal):
            # As stored: Decimal("4") assigned in memory and "4.000" loaded are the same.
            return value.quantize(Decimal(1).scaleb(-field.decimal_places))
        return value

    def audit_workspace(self) -> models.Model | None:
        """The workspace this object belongs to, for scoping the audit log."""
        return None


def record(
    *,
    action: str,
    workspace: models.Model | None = None,
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
        # The client: behind a trusted proxy, portal.middleware.TrustedProxyMiddleware has put
        # the address it forwarded for here, never one the client merely claimed.
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


@dataclass(frozen=True)
class FieldChange:
    """One field of an audit event as people read it. ``before`` is None for a field that
    did not exist before (a create), ``after`` for one that no longer exists (a delete)."""

    field: str
    before: str | None
    after: str | None

    @property
    def text(self) -> str:
        if self.before is not None and self.after is not None:
            return f"{self.before} → {self.after}"
        return self.after if self.after is not None else self.before or ""


_EMPTY: tuple[Any, ...] = (None, "", [], {})


def describe_changes(event: AuditEvent) -> list[FieldChange]:
    """The fields an event changed, old → new, in the model's field order.

    A create lists the values the object was created with, a delete those it had; fields
    without a value are left out of both. Values read the way people write them, for
    events recorded before that was so too (a quota of ``"4294967296.000"`` reads ``4Gi``).
    """
    before = event.before if isinstance(event.before, dict) else None
    after = event.after if isinstance(event.after, dict) else None
    if before is None and after is None:
        return []
    fields = _model_fields(event.object_type)
    keys = list(dict.fromkeys([*(before or {}), *(after or {})]))
    order = {name: index for index, name in enumerate(fields)}
    keys.sort(key=lambda key: order.get(key, len(order)))
    changes = []
    for key in keys:
        field = fields.get(key)
        if before is not None and after is not None:
            old, new = before.get(key), after.get(key)
            if old == new:
                continue
            changes.append(FieldChange(key, _display_value(field, old), _display_value(field, new)))
        elif after is not None:
            if after[key] in _EMPTY:
                continue
            changes.append(FieldChange(key, None, _display_value(field, after[key])))
        elif before is not None:
            if before[key] in _EMPTY:
                continue
            changes.append(FieldChange(key, _display_value(field, before[key]), None))
    return changes


def _model_fields(object_type: str) -> dict[str, models.Field[Any, Any]]:
    try:
        model = apps.get_model(object_type)
    except (LookupError, ValueError):  # not a model ("oidc"), or one that no longer exists
        return {}
    return {field.name: field for field in model._meta.concrete_fields}


def _display_value(field: models.Field[Any, Any] | None, value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        if isinstance(field, models.DecimalField) and _recorded_as_decimal(field, value):
            return _as_in_form(field, Decimal(value))
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    return str(value)


def _recorded_as_decimal(field: models.DecimalField[Any, Any], value: str) -> bool:
    # Before AuditedModel.audit_value existed, every decimal was recorded with exactly
    # decimal_places digits ("4294967296.000"); quantities are now recorded as "4Gi".
    return re.fullmatch(rf"-?\d+\.\d{{{field.decimal_places}}}", value) is not None


def _as_in_form(field: models.DecimalField[Any, Any], value: Decimal) -> str:
    """The value as the field's own form shows it: a quota amount as a quantity."""
    form_field = field.formfield()
    return str(value if form_field is None else form_field.prepare_value(value))
