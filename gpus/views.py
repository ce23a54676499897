"""GPU pages: the fleet and each node (platform staff), a workspace's GPU use (its members),
and a run's GPUs (the run page's section).

The fleet's rows come from the database (``gpus.selectors``: what the last sync saw), so a
page costs a fixed number of queries and shows the last-known state while Kubernetes cannot
be reached; telemetry comes from Prometheus through ``gpus.readings`` (cached, shared, and
a notice instead of numbers when it is down). Live parts poll with an ETag, as everywhere in
the portal, and pause while the tab is hidden (static/js/portal.js).
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.contrib import messages
from django.core.cache import cache
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.vary import vary_on_headers
from django.views.generic import TemplateView

from gpus import actions, fleet_table, run_gpus, selectors, workspace_gpus
from gpus import readings as telemetry
from gpus.models import FleetSync, GpuNode
from portal import live
from portal.requests import signed_in_user
from runs.models import Run
from workspaces.access import StaffRequiredMixin, WorkspaceViewMixin

#: How often the live parts ask again (ms): the fleet follows the sync, GPUs the scrape.
FLEET_POLL_MS = 10_000
TELEMETRY_POLL_MS = 15_000
#: A rendered fleet page is reused this long at most (its ETag changes with the fleet).
FLEET_PAGE_CACHE_SECONDS = 60


def _reading_tag(reading: telemetry.Reading[Any]) -> str:
    return f"{reading.at.isoformat() if reading.at else ''}:{reading.notice}"


@method_decorator(vary_on_headers("HX-Request"), name="dispatch")
class FleetView(StaffRequiredMixin, TemplateView):
    """Every GPU node, grouped by pool: capacity, use, health, taints, cordoned, the runs on
    it, and its GPUs' utilisation, memory, temperature and power. Unhealthy nodes first, in
    a list of their own."""

    template_name = "gpus/fleet.html"

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        sync = selectors.fleet_sync()
        state = selectors.fleet_state()
        summaries = telemetry.fleet_summaries()
        etag = live.etag(
            sync.last_success_at if sync else "",
            sync.last_error if sync else "",
            state,
            _reading_tag(summaries),
        )
        if live.not_modified(request, etag):
            return live.tagged(HttpResponse(status=304), etag)
        fragment = request.headers.get("HX-Request") == "true"
        # The rendered page is the same for every member of the platform team until the
        # fleet or its telemetry changes: rendered once, shared through the cache.
        key = f"gpus:fleet-page:{fragment}:{etag.strip(chr(34))}"
        html = cache.get(key)
        if html is None:
            fleet, parts = _fleet_rows(sync, state)
            by_host = summaries.value or {}
            context = {
                "fleet": fleet,
                "pools": [
                    {"pool": pool, "rows": fleet_table.node_rows(rows, by_host)}
                    for pool, rows in zip(fleet.pools, parts, strict=True)
                ],
                "unhealthy": fleet.unhealthy_nodes,
                "telemetry_notice": summaries.notice,
                "telemetry_configured": telemetry.configured(),
                "poll_ms": FLEET_POLL_MS,
                "etag": etag,
            }
            template = "gpus/fleet.html#live" if fragment else self.template_name
            html = render_to_string(template, context, request=request)
            cache.set(key, html, timeout=FLEET_PAGE_CACHE_SECONDS)
        return live.tagged(HttpResponse(html), etag)


def _fleet_rows(
    sync: FleetSync | None, state: tuple[int, object]
) -> tuple[selectors.Fleet, list[list[fleet_table.RowParts]]]:
    """The fleet and its rows around their telemetry, kept while no node changes (``state``):
    a new telemetry reading, every few seconds, then costs only its own cells."""
    key = "gpus:fleet-rows:" + hashlib.sha256(repr(state).encode()).hexdigest()[:32]
    found = cache.get(key)
    if found is None:
        fleet = selectors.fleet(sync)
        found = (fleet, [fleet_table.row_parts(pool.nodes) for pool in fleet.pools])
        cache.set(key, found, timeout=FLEET_PAGE_CACHE_SECONDS)
    cached_fleet, parts = found
    # The sync row is the one just read (its times move at every sync; the rows do not).
    return selectors.Fleet(pools=cached_fleet.pools, sync=sync), parts


def _node_or_404(name: str) -> GpuNode:
    node = selectors.node_named(name)
    if node is None:
        raise Http404(f"No GPU node named {name!r} (the fleet page lists them).")
    return node


@method_decorator(vary_on_headers("HX-Request"), name="dispatch")
class NodeView(StaffRequiredMixin, TemplateView):
    """One node: its conditions with their messages and times, taints, the runs on it, each
    GPU's live telemetry, and charts of the last hour (or day, or week)."""

    template_name = "gpus/node.html"

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        node = _node_or_404(kwargs["node_name"])
        gpus = telemetry.node_gpus(node.name)
        samples = gpus.value or []
        window, _ = telemetry.window_of(request.GET.get("window"))
        etag = live.etag(node.updated_at, node.cordoned, _reading_tag(gpus), window)
        context = {
            "node": node,
            "samples": samples,
            "summary": telemetry.summary(samples),
            "telemetry_notice": gpus.notice,
            "telemetry_configured": telemetry.configured(),
            "sync": selectors.fleet_sync(),
            "window": window,
            "windows": list(telemetry.WINDOWS),
            "poll_ms": TELEMETRY_POLL_MS,
        }
        template = "gpus/node.html#live" if request.headers.get("HX-Request") else None
        return live.fragment_response(request, template or self.template_name, context, etag)


class NodeTelemetryView(StaffRequiredMixin, View):
    """The node page's charts as JSON: per charted metric, per GPU, (time, value) points."""

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        node = _node_or_404(kwargs["node_name"])
        window, span = telemetry.window_of(request.GET.get("window"))
        reading = telemetry.node_charts(node.name, span)
        etag = live.etag(node.name, window, _reading_tag(reading))
        if live.not_modified(request, etag):
            return live.tagged(HttpResponse(status=304), etag)
        return live.tagged(
            JsonResponse(
                {
                    "node": node.name,
                    "window": window,
                    "notice": reading.notice,
                    "charts": [
                        {"field": chart.field, "series": chart.series}
                        for chart in reading.value or []
                    ],
                }
            ),
            etag,
        )


class NodeActionView(StaffRequiredMixin, TemplateView):
    """Cordon or uncordon: GET shows what it changes and the runs on the node; POST does it
    (audited, with the reason given)."""

    template_name = "gpus/node_action.html"
    action = "cordon"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        node = _node_or_404(kwargs["node_name"])
        context.update(
            {"node": node, "action": self.action, "affected": actions.runs_affected(node)}
        )
        return context

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        node = _node_or_404(kwargs["node_name"])
        reason = request.POST.get("reason", "").strip()[:500]
        if "\x00" in reason:
            reason = reason.replace("\x00", "")
        act = actions.cordon_node if self.action == "cordon" else actions.uncordon_node
        try:
            act(node.name, actor=signed_in_user(request), reason=reason)
        except actions.NodeAlreadyInState as already:
            messages.info(request, str(already))
        except actions.NodeActionFailed as error:
            messages.error(request, f"{node.name} was not {self.action}ed: {error}")
        else:
            done = (
                "cordoned: no new pods will be placed on it"
                if self.action == "cordon"
                else ("uncordoned: new pods may be placed on it again")
            )
            messages.success(request, f"{node.name} is {done}.")
        return HttpResponseRedirect(reverse("gpu-node", kwargs={"node_name": node.name}))


@method_decorator(vary_on_headers("HX-Request"), name="dispatch")
class WorkspaceGpusView(WorkspaceViewMixin, TemplateView):
    """A workspace's GPU use: what it holds now against its quota, each run holding GPUs
    with its utilisation, and GPUs held over time, per run. Only this workspace's runs and
    pods: nothing of the nodes' other tenants."""

    template_name = "gpus/workspace.html"

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        window, _ = telemetry.window_of(request.GET.get("window") or "24h")
        now_view = workspace_gpus.now(self.workspace)
        etag = live.etag(now_view.etag, window)
        context = {
            **self.get_context_data(**kwargs),
            "view": now_view,
            "window": window,
            "windows": list(telemetry.WINDOWS),
            "poll_ms": TELEMETRY_POLL_MS,
        }
        template = "gpus/workspace.html#live" if request.headers.get("HX-Request") else None
        return live.fragment_response(request, template or self.template_name, context, etag)


class WorkspaceGpuUsageView(WorkspaceViewMixin, View):
    """The workspace page's chart as JSON: GPUs held over time, per run, and the quota."""

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        window, span = telemetry.window_of(request.GET.get("window") or "24h")
        usage = workspace_gpus.held_over_time(self.workspace, span, now=timezone.now())
        return JsonResponse({"window": window, **usage}, json_dumps_params={"default": str})


class RunGpusView(WorkspaceViewMixin, View):
    """The run page's GPU section: its GPUs' telemetry and its efficiency (polled while the
    run is live)."""

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        run = Run.objects.for_workspace(self.workspace).filter(name=kwargs["run_name"]).first()
        if run is None:
            raise Http404("No such run in this workspace.")
        report = run_gpus.report(run)
        etag = live.etag(run.state, run.updated_at, report.etag)
        context = {
            "run": run,
            "workspace": self.workspace,
            "report": report,
            "poll_ms": TELEMETRY_POLL_MS,
        }
        return live.fragment_response(request, "gpus/_run_gpus.html", context, etag)
