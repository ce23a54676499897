"""Endpoint pages (issue 34): a workspace's endpoints, one endpoint (live), its log panel, and
the scale, stop and delete buttons of those who may use them.

As the run pages do, one template renders a page and its fragments (template partials):
the list's rows and the endpoint's live part poll while something runs, and answer 304 after
the few queries that find the rows when nothing changed. Who may act is
``serving.access.may_act_on``, the API's rule; what an action does is the API's services.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.vary import vary_on_headers
from django.views.generic import TemplateView

from portal import live
from portal.requests import signed_in_user
from serving import preemption, selectors, services
from serving.access import REFUSAL, may_act_on
from serving.backends import REPLICA_NAME, EndpointsUnavailable, backend_for_endpoint
from serving.models import LIVE_STATES, Endpoint
from workspaces.access import WorkspaceViewMixin
from workspaces.models import Role

#: Endpoints a page of the list shows.
ENDPOINTS_PER_PAGE = 50
#: Events of an endpoint's history its page shows (the export has them all).
EVENTS_SHOWN = 50
#: Lines of a replica's log the log panel shows.
LOG_LINES = 200


def _live_parts(endpoint: Endpoint) -> tuple[Any, ...]:
    """What a row of the list, or the live part of its page, shows that changes by itself."""
    return (
        endpoint.pk,
        endpoint.state,
        endpoint.state_reason,
        endpoint.replicas_ready,
        endpoint.replicas_desired,
        endpoint.generation,
        endpoint.url,
        endpoint.requests_per_second,
        endpoint.latency_p95_ms,
        endpoint.error_rate,
        endpoint.last_request_at,
        endpoint.updated_at,
        getattr(endpoint, "idle", None),
    )


@method_decorator(vary_on_headers("HX-Request"), name="dispatch")  # fragments for htmx
class EndpointListView(WorkspaceViewMixin, TemplateView):
    """The workspace's endpoints, newest first, with their traffic; idle ones flagged."""

    template_name = "serving/list.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        page = Paginator(selectors.endpoints_of(self.workspace), ENDPOINTS_PER_PAGE).get_page(
            self.request.GET.get("page")
        )
        context.update(
            {
                "endpoints": page,
                "any_live": any(endpoint.state in LIVE_STATES for endpoint in page),
                "idle_hours": selectors.idle_hours(),
            }
        )
        return context

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        context = self.get_context_data(**kwargs)
        if request.headers.get("HX-Request"):
            etag = live.etag(
                "endpoints",
                context["endpoints"].number,
                *[_live_parts(endpoint) for endpoint in context["endpoints"]],
            )
            return live.fragment_response(request, "serving/list.html#rows", context, etag)
        return self.render_to_response(context)


def _preemption(endpoint: Endpoint, workspace: Any) -> str:
    try:
        return preemption.described(workspace, backend_for_endpoint(endpoint))
    except EndpointsUnavailable:
        return ""


@method_decorator(vary_on_headers("HX-Request"), name="dispatch")  # fragments for htmx
class EndpointDetailView(WorkspaceViewMixin, TemplateView):
    """One endpoint: its state and why, where it answers and how to call it, its model
    version, replicas and traffic, its history, its log, and the actions of those allowed."""

    template_name = "serving/detail.html"

    def _context(self, endpoint: Endpoint) -> dict[str, Any]:
        invoke = reverse(
            "api:endpoint-invoke",
            kwargs={"workspace_slug": self.workspace.slug, "name": endpoint.name, "path": ""},
        )
        serve = endpoint.spec.get("serve") or {}
        replica = _replica_asked(self.request)
        log_url = reverse(
            "endpoint-page-log",
            kwargs={"workspace_slug": self.workspace.slug, "name": endpoint.name},
        )
        return {
            "endpoint": endpoint,
            "events": selectors.history_of(endpoint, limit=EVENTS_SHOWN),
            "is_live": endpoint.is_live,
            "may_act": may_act_on(endpoint, access=self.access, user_id=self.request.user.pk),
            "autoscaling": serve.get("autoscaling"),
            "max_replicas": services.MAX_REPLICAS,
            "invoke_url": self.request.build_absolute_uri(invoke),
            "idle_hours": selectors.idle_hours(),
            "log_url": f"{log_url}?{urlencode({'replica': replica})}" if replica else log_url,
            "preemption": _preemption(endpoint, self.workspace),
        }

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        endpoint = selectors.endpoint_or_404(self.workspace, kwargs["name"])
        if request.headers.get("HX-Request"):
            newest = selectors.history_of(endpoint, limit=1)
            etag = live.etag("endpoint", *_live_parts(endpoint), newest[0].seq if newest else 0)
            if live.not_modified(request, etag):
                return live.fragment_response(request, "serving/detail.html#live", {}, etag)
            context = {**self.get_context_data(**kwargs), **self._context(endpoint)}
            return live.fragment_response(request, "serving/detail.html#live", context, etag)
        context = {**self.get_context_data(**kwargs), **self._context(endpoint)}
        return self.render_to_response(context)


@method_decorator(vary_on_headers("HX-Request"), name="dispatch")
class EndpointLogView(WorkspaceViewMixin, View):
    """The endpoint page's log panel: the last lines of a replica's log, from its backend
    (what ``GET …/endpoints/{name}/logs/`` answers), as a fragment that polls while the
    endpoint runs. ``?replica=`` names the replica (default: the backend's choice)."""

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        endpoint = selectors.endpoint_or_404(self.workspace, kwargs["name"])
        replica = _replica_asked(request)
        context: dict[str, Any] = {
            "workspace": self.workspace,
            "endpoint": endpoint,
            "is_live": endpoint.is_live,
            "replica": replica,
            "log_url": request.get_full_path(),
        }
        if not endpoint.is_live:
            context["note"] = (
                f"{endpoint.name} is {endpoint.get_state_display().lower()}: nothing of it "
                "runs, so it has no log to read."
            )
        else:
            try:
                context["log"] = backend_for_endpoint(endpoint).read_log(
                    endpoint, offset=None, tail_lines=LOG_LINES, replica=replica or None
                )
            except EndpointsUnavailable as exc:
                context["note"] = f"Its backend cannot say: {exc}."
            except Exception as exc:  # the backend did not answer: the panel says so, and retries
                context["note"] = f"The {endpoint.backend} backend did not answer: {exc}"
        log = context.get("log")
        etag = live.etag(
            "endpoint-log",
            endpoint.pk,
            endpoint.state,
            replica,
            context.get("note", ""),
            (log.replica, log.next_offset, log.size, log.text, log.note) if log else "",
        )
        return live.fragment_response(request, "serving/_log.html", context, etag)


def _replica_asked(request: HttpRequest) -> str:
    """The replica ``?replica=`` names, or "" (the backend's choice) for none or a name no
    replica can have (the API refuses those; the page shows the default instead)."""
    replica = request.GET.get("replica", "").strip()
    return replica if REPLICA_NAME.fullmatch(replica) else ""


class EndpointActionView(WorkspaceViewMixin, View):
    """Scale, stop or delete from the endpoint's page (a form post; the page asks first)."""

    write_role = Role.RESEARCHER
    action = ""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        endpoint = selectors.endpoint_or_404(self.workspace, kwargs["name"])
        if not may_act_on(endpoint, access=self.access, user_id=request.user.pk):
            raise PermissionDenied(REFUSAL)
        user = signed_in_user(request)
        page = reverse(
            "endpoint-page", kwargs={"workspace_slug": self.workspace.slug, "name": endpoint.name}
        )
        try:
            if self.action == "scale":
                replicas = request.POST.get("replicas", "").strip()
                if not replicas.isascii() or not replicas.isdigit() or len(replicas) > 4:
                    raise ValueError(
                        f"an endpoint has 1 to {services.MAX_REPLICAS} replicas: "
                        "give a whole number"
                    )
                before = endpoint.generation
                scaled = services.scale_endpoint(
                    endpoint=endpoint, user=user, replicas=int(replicas)
                )
                if scaled.generation == before:
                    messages.info(
                        request,
                        f"{endpoint.name} has {scaled.replicas_desired} replica"
                        f"{'s' if scaled.replicas_desired != 1 else ''} already: nothing "
                        "changed.",
                    )
                else:
                    messages.success(
                        request,
                        f"Scaling {endpoint.name} to {scaled.replicas_desired} "
                        f"replica{'s' if scaled.replicas_desired != 1 else ''} "
                        f"(generation {scaled.generation}).",
                    )
            elif self.action == "stop":
                services.stop_endpoint(endpoint=endpoint, user=user)
                messages.success(request, f"Stopped {endpoint.name}: its resources are freed.")
            else:
                services.delete_endpoint(endpoint=endpoint, user=user)
                messages.success(
                    request, f"Deleted {endpoint.name}: its name is free; its record is kept."
                )
                return HttpResponseRedirect(
                    reverse("endpoints", kwargs={"workspace_slug": self.workspace.slug})
                )
        except (ValueError, services.EndpointActionRefused, EndpointsUnavailable) as exc:
            messages.error(request, f"Not done: {exc}")
        return HttpResponseRedirect(page)
