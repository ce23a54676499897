"""Pages of the UI shell that are not inside one workspace."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.mixins import LoginRequiredMixin
from django.views.generic import TemplateView

from workspaces.selectors import user_workspaces


class HomeView(LoginRequiredMixin, TemplateView):
    """Your workspaces: where to go next after logging in."""

    template_name = "portal/home.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["workspaces"] = user_workspaces(self.request)
        return context
