"""The platform admin's site: Django's admin, named for TauGrid, refusing one request shape
Django's own admin does not (an empty ``_to_field``, which reaches ``get_field("")`` and
ends in a 500; any other field the model does not allow is already a 400 there)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.contrib.admin.exceptions import DisallowedModelAdminToField
from django.contrib.admin.options import TO_FIELD_VAR
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseBase

View = TypeVar("View", bound=Callable[..., HttpResponseBase])


class TauGridAdminSite(admin.AdminSite):
    site_header = "TauGrid platform admin"
    site_title = "TauGrid admin"
    index_title = "Workspaces, members, quotas and audit"
    # The sidebar repeats the index's list of models and took a quarter of a 1280 px window
    # from every list and form; the index and the breadcrumbs lead everywhere it did.
    enable_nav_sidebar = False

    def admin_view(self, view: View, cacheable: bool = False) -> View:
        checked = super().admin_view(view, cacheable)

        @functools.wraps(view)
        def refuse_empty_to_field(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            if "" in (request.GET.get(TO_FIELD_VAR), request.POST.get(TO_FIELD_VAR)):
                raise DisallowedModelAdminToField("An empty _to_field names no field.")
            return checked(request, *args, **kwargs)

        return cast(View, refuse_empty_to_field)


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A model the platform admin reads and never writes through the admin (the audit log,
    usage, outbox rows): every row, whatever its workspace (staff see all), no add, change or
    delete. Actions a list offers (such as sealing evidence again) go through services."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)
        unscoped = getattr(queryset, "unscoped", None)
        return unscoped() if unscoped is not None else queryset

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class TauGridAdminConfig(AdminConfig):
    default_site = "portal.admin_site.TauGridAdminSite"
