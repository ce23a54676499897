"""The kernel's one model: the append-only audit log (identities and API tokens live in the
``identity`` app)."""

from __future__ import annotations

from typing import Any, ClassVar, NoReturn

from django.db import models
from django.utils import timezone

from portal.tenancy import TenantManager, TenantModel, TenantQuerySet, UnscopedTenantManager


class AuditLogIsAppendOnly(RuntimeError):
    """Audit events are written once and never changed or removed by the application."""


class AuditEventQuerySet(TenantQuerySet["AuditEvent"]):
    def update(self, **kwargs: Any) -> NoReturn:
        raise AuditLogIsAppendOnly("audit events cannot be changed")

    def delete(self) -> NoReturn:
        raise AuditLogIsAppendOnly("audit events cannot be deleted")


class AuditEventManager(TenantManager["AuditEvent"]):
    def get_queryset(self) -> AuditEventQuerySet:
        return AuditEventQuerySet(self.model, using=self._db)


class UnscopedAuditEventManager(UnscopedTenantManager["AuditEvent"]):
    def get_queryset(self) -> AuditEventQuerySet:
        return AuditEventQuerySet(self.model, using=self._db).unscoped()


class AuditEvent(TenantModel):
    """Who did what to which object, when and from where, with the state before and after.

    Actor and workspace are kept by id and name, not as enforced foreign keys: deleting a
    user or a workspace must neither fail nor erase the record of what they did.
    """

    time = models.DateTimeField(default=timezone.now, db_index=True)
    action = models.CharField(max_length=40, db_index=True)
    source = models.CharField(max_length=20, help_text="admin, api, web, cli or system")
    actor_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    actor_username = models.CharField(max_length=150, blank=True)
    workspace = models.ForeignKey(
        "workspaces.Workspace",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        null=True,
        blank=True,
        related_name="+",
    )
    workspace_slug = models.CharField(max_length=40, blank=True)
    object_type = models.CharField(max_length=100, blank=True, db_index=True)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)

    objects: ClassVar[AuditEventManager] = AuditEventManager()
    unscoped_objects: ClassVar[UnscopedAuditEventManager] = UnscopedAuditEventManager()

    class Meta(TenantModel.Meta):
        ordering = ["-time", "-id"]
        indexes = [models.Index(fields=["workspace", "-time"], name="audit_workspace_time")]

    def __str__(self) -> str:
        who = self.actor_username or "system"
        when = f"{self.time:%Y-%m-%d %H:%M:%S}"
        return f"{when} {who} {self.action} {self.object_type} {self.object_repr}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AuditLogIsAppendOnly("audit events cannot be changed")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise AuditLogIsAppendOnly("audit events cannot be deleted")
