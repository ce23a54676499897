"""A workspace's home page: it shows runs, quota use and members, so it lives in the shell
above both apps."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q
from django.views.generic import TemplateView

from pipelines.views import pipelines_of
from runs.models import LIVE_STATES, RUNNING_STATES, WAITING_STATES, Run
from runs.usage import usage_lines
from workspaces.access import WorkspaceViewMixin
from workspaces.models import Membership


class WorkspaceHomeView(WorkspaceViewMixin, TemplateView):
    """My recent runs, what is queued and running, quota use, members."""

    template_name = "workspaces/home.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        runs = Run.objects.for_workspace(self.workspace)
        counts = runs.aggregate(
            queued=Count("id", filter=Q(state__in=WAITING_STATES)),
            running=Count("id", filter=Q(state__in=RUNNING_STATES)),
        )
        context.update(
            {
                "usage": usage_lines(self.workspace),
                "my_runs": list(
                    runs.filter(submitted_by=self.request.user.pk).order_by("-created_at", "-id")[
                        :8
                    ]
                ),
                "active_runs": list(
                    runs.filter(state__in=LIVE_STATES).order_by("-created_at", "-id")[:10]
                ),
                "counts": counts,
                "pipelines": list(pipelines_of(self.workspace)[:5]),
                "members": list(
                    Membership.objects.for_workspace(self.workspace)
                    .select_related("user")
                    .order_by("user__username")[:50]
                ),
            }
        )
        return context
