"""Fail-closed tenancy for querysets.

Every model that belongs to a workspace uses :class:`TenantManager`. Its querysets refuse to
run unless they are restricted to a workspace, so a view or task that forgets to scope a
query fails loudly in development and tests instead of leaking another team's data.

A queryset counts as scoped when its top-level ``AND`` conditions include an exact or ``IN``
match on the field that leads to the workspace (``workspace``, or a parent such as ``run``
for a model whose ``tenant_path`` is ``"run__workspace"``). That is what ``for_workspace()``
and Django's related managers (``workspace.memberships.all()``) produce, and what Django's
own uniqueness validation produces for constraints that include the workspace.

The single escape hatch is ``unscoped()`` (and ``unscoped_objects``, the manager Django's own
machinery uses: model forms, the admin, uniqueness checks): grep for "unscoped" to review
every place that reads across workspaces.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, ClassVar, Self, TypeVar

from django.db import models
from django.db.models.expressions import Col
from django.db.models.lookups import Exact, In
from django.db.models.sql.where import AND, WhereNode

_M = TypeVar("_M", bound=models.Model)


class UnscopedQueryError(RuntimeError):
    """A tenant-owned queryset was evaluated without being restricted to a workspace."""


@functools.cache
def _anchor_fields(model: type[models.Model]) -> tuple[models.Field[Any, Any], ...]:
    """The foreign keys along ``model.tenant_path``; filtering on any of them scopes a query."""
    path: str | None = getattr(model, "tenant_path", "workspace")
    if path is None:
        return ()  # scoped only by an explicit method (the Workspace model itself)
    fields: list[models.Field[Any, Any]] = []
    current: type[models.Model] = model
    for name in path.split("__"):
        field = current._meta.get_field(name)
        if not isinstance(field, models.ForeignKey):
            raise TypeError(f"{model.__name__}.tenant_path must follow foreign keys, not {name!r}")
        fields.append(field)
        current = field.related_model  # type: ignore[assignment]
    return tuple(fields)


def _where_is_scoped(node: WhereNode, anchors: tuple[models.Field[Any, Any], ...]) -> bool:
    if node.negated or (node.connector != AND and len(node.children) > 1):
        return False
    for child in node.children:
        if isinstance(child, WhereNode):
            if _where_is_scoped(child, anchors):
                return True
        elif (
            isinstance(child, Exact | In)
            and isinstance(child.lhs, Col)
            and any(child.lhs.target is anchor for anchor in anchors)
        ):
            return True
    return False


class TenantQuerySet(models.QuerySet[_M]):
    _tenant_scope_ok: bool = False

    def for_workspace(self, workspace: models.Model | int) -> Self:
        path: str = getattr(self.model, "tenant_path", "workspace")
        return self.filter(**{path: workspace})

    def for_workspaces(self, workspaces: Iterable[models.Model] | models.QuerySet[Any]) -> Self:
        path: str = getattr(self.model, "tenant_path", "workspace")
        return self.filter(**{f"{path}__in": workspaces})

    def unscoped(self) -> Self:
        """Read across all workspaces. Only for platform staff views and system tasks."""
        return self._mark_scoped()

    def _mark_scoped(self) -> Self:
        clone: Self = self.all()
        clone._tenant_scope_ok = True
        return clone

    def is_scoped(self) -> bool:
        if self._tenant_scope_ok or self.query.is_empty():
            return True
        return _where_is_scoped(self.query.where, _anchor_fields(self.model))

    def _require_scope(self) -> None:
        if not self.is_scoped():
            raise UnscopedQueryError(
                f"{self.model.__name__} rows belong to workspaces: restrict the query with "
                f".for_workspace(...) (or call .unscoped() where reading across workspaces "
                f"is intended)"
            )

    def _clone(self) -> Self:
        clone = super()._clone()  # type: ignore[misc]
        clone._tenant_scope_ok = self._tenant_scope_ok
        return clone  # type: ignore[no-any-return]

    # Every way a queryset reaches the database goes through one of these.
    def _fetch_all(self) -> None:
        if self._result_cache is None:
            self._require_scope()
        super()._fetch_all()

    def iterator(self, chunk_size: int | None = None) -> Any:
        self._require_scope()
        return super().iterator(chunk_size=chunk_size)

    def count(self) -> int:
        if self._result_cache is None:
            self._require_scope()
        return super().count()

    def exists(self) -> bool:
        if self._result_cache is None:
            self._require_scope()
        return super().exists()

    def aggregate(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._require_scope()
        return super().aggregate(*args, **kwargs)

    def update(self, **kwargs: Any) -> int:
        self._require_scope()
        return super().update(**kwargs)

    def delete(self) -> tuple[int, dict[str, int]]:
        self._require_scope()
        return super().delete()

    def explain(self, *, format: str | None = None, **options: Any) -> str:
        self._require_scope()
        return super().explain(format=format, **options)


class TenantManager(models.Manager[_M]):
    """Default manager of tenant-owned models: querysets must be scoped before they run."""

    def get_queryset(self) -> TenantQuerySet[_M]:
        return TenantQuerySet(self.model, using=self._db)

    def for_workspace(self, workspace: models.Model | int) -> TenantQuerySet[_M]:
        return self.get_queryset().for_workspace(workspace)

    def for_workspaces(
        self, workspaces: Iterable[models.Model] | models.QuerySet[Any]
    ) -> TenantQuerySet[_M]:
        return self.get_queryset().for_workspaces(workspaces)

    def unscoped(self) -> TenantQuerySet[_M]:
        return self.get_queryset().unscoped()


class UnscopedTenantManager(TenantManager[_M]):
    """The manager Django's own machinery uses (model forms, the admin's inline formsets,
    uniqueness checks): it reads across workspaces, so application code never uses it."""

    def get_queryset(self) -> TenantQuerySet[_M]:
        return super().get_queryset().unscoped()


class TenantModel(models.Model):
    """Base for models that belong to a workspace.

    ``objects`` refuses unscoped queries. Django itself reaches rows through the default
    manager, which is ``unscoped_objects``: that keeps forms and the admin working, and every
    such use still shows up when grepping for "unscoped".
    """

    tenant_path: ClassVar[str | None] = "workspace"

    objects = TenantManager[Any]()
    unscoped_objects = UnscopedTenantManager[Any]()

    class Meta:
        abstract = True
        default_manager_name = "unscoped_objects"
