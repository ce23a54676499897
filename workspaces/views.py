"""Workspace pages."""

from __future__ import annotations

from typing import Any

from django.views.generic import TemplateView

from workspaces.access import WorkspaceViewMixin
from workspaces.models import Membership
from workspaces.selectors import quota_lines


class WorkspaceHomeView(WorkspaceViewMixin, TemplateView):
    template_name = "workspaces/home.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["quotas"] = quota_lines(self.workspace)
        context["members"] = list(
            Membership.objects.for_workspace(self.workspace)
            .select_related("user")
            .order_by("user__username")[:50]
        )
        return context
