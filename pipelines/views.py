"""Pipeline pages (issue 35): a workspace's pipelines, and one pipeline drawn as its graph —
a box per stage with its state, duration, key metrics and links, edges labelled with what
passed along them — that updates itself while it runs, and becomes a list on a narrow screen.

As the run and endpoint pages do, one template renders a page and its live fragment
(template partials); the fragment polls while the pipeline runs and answers 304 when nothing
changed. Who may cancel or resume is the API's rule (``pipelines.api.views.may_act_on``); what
those do is :mod:`pipelines.orchestration`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.vary import vary_on_headers
from django.views.generic import TemplateView

from pipelines import orchestration
from pipelines.api.views import REFUSAL, may_act_on
from pipelines.layout import BOX_HEIGHT, BOX_WIDTH, Graph, layout
from pipelines.models import Pipeline, PipelineEvent, PipelineStage
from pipelines.orchestration import RESUMABLE
from pipelines.planning import PipelineState, StageState
from pipelines.selectors import produced, stages_of
from portal import live
from portal.requests import signed_in_user
from tau.pipeline import Gate, load_pipeline
from workspaces.access import WorkspaceViewMixin

#: Pipelines a page of the list shows.
PIPELINES_PER_PAGE = 50
#: Events of a pipeline's history its page shows.
EVENTS_SHOWN = 50
#: Metrics a stage's box shows (its row in the list shows them all).
BOX_METRICS = 2
#: What the history says of each kind of event.
EVENT_WORDS = {
    "submitted": "Submitted",
    "stage_started": "Stage started",
    "stage_not_started": "Stage could not start",
    "stage_reused": "Stage reused",
    "stage_resumed": "Stage resumed",
    "stage_ended": "Stage ended",
    "stage_held": "Stage held",
    "gate": "Gate",
    "cancel_requested": "Cancel asked",
    "resumed": "Resumed",
    "ended": "Ended",
}


def pipelines_of(workspace: Any) -> QuerySet[Pipeline]:
    """The workspace's pipelines, newest first, each with how many of its stages are done
    (``done``: succeeded or reused) of how many (``total``), in the same query."""
    done = [StageState.SUCCEEDED.value, StageState.REUSED.value]
    return (
        Pipeline.objects.for_workspace(workspace)
        .annotate(
            total=Count("stages"),
            done=Count("stages", filter=Q(stages__state__in=done)),
        )
        .order_by("-created_at", "-id")
    )


def pipeline_or_404(workspace: Any, name: str) -> Pipeline:
    pipeline = None if "\x00" in name else pipelines_of(workspace).filter(name=name).first()
    if pipeline is None:
        raise Http404(f"This workspace has no pipeline named {name!r}.")
    return pipeline


@dataclass
class StageView:
    """A stage as its box and its row show it."""

    stage: PipelineStage
    x: int = 0
    y: int = 0
    made: list[dict[str, Any]] = field(default_factory=list)

    @property
    def box_metrics(self) -> list[tuple[str, float]]:
        return sorted(self.stage.metrics.items())[:BOX_METRICS]

    @property
    def duration(self) -> Any:
        stage = self.stage
        if stage.started_at is None or stage.ended_at is None or stage.state == "reused":
            return None
        return stage.ended_at - stage.started_at


@dataclass(frozen=True)
class EdgeView:
    source: str
    target: str
    path: str
    label_x: int
    label_y: int
    label: str


def _label(source: StageView, target: StageView) -> str:
    """What passed along an edge, short enough for the room between two boxes (the stage's row
    says it in words): the versions the source stage made; or the gate the target reads of
    it, with the value it read and whether it passed (✓, ✗)."""
    made = [f"{item['name']}@{item['version']}" for item in source.made if "version" in item]
    if made:
        return ", ".join(made[:2]) + ("…" if len(made) > 2 else "")
    decided = target.stage.gate_decision
    gate = Gate.parse(target.stage.gate) if target.stage.gate else None
    if gate is not None and gate.stage == source.stage.name and decided:
        return f"{gate.metric}={decided['value']:g} {'✓' if decided.get('passed') else '✗'}"
    return ""


def _drawn(pipeline: Pipeline) -> tuple[list[StageView], list[EdgeView], Graph | None]:
    stages = stages_of(pipeline)
    made = produced(pipeline, stages)
    views = {stage.name: StageView(stage, made=made.get(stage.name, [])) for stage in stages}
    pipeline_file, _ = load_pipeline(pipeline.source)
    if pipeline_file is None:  # a kept file was checked: only a bug gets here
        return list(views.values()), [], None
    graph = layout(pipeline_file)
    for box in graph.boxes:
        views[box.stage].x, views[box.stage].y = box.x, box.y
    edges = [
        EdgeView(
            edge.source,
            edge.target,
            edge.path,
            edge.label_x,
            edge.label_y,
            _label(views[edge.source], views[edge.target]),
        )
        for edge in graph.edges
    ]
    return list(views.values()), edges, graph


def _live_parts(pipeline: Pipeline) -> tuple[Any, ...]:
    """What changes on its own: the pipeline's row and its newest event."""
    newest = (
        PipelineEvent.objects.for_workspace(pipeline.workspace_id)
        .filter(pipeline=pipeline)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    return (pipeline.pk, pipeline.state, pipeline.updated_at, newest)


@method_decorator(vary_on_headers("HX-Request"), name="dispatch")  # fragments for htmx
class PipelineListView(WorkspaceViewMixin, TemplateView):
    """The workspace's pipelines, newest first."""

    template_name = "pipelines/list.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        page = Paginator(pipelines_of(self.workspace), PIPELINES_PER_PAGE).get_page(
            self.request.GET.get("page")
        )
        rows = list(page)
        context.update(
            {
                "pipelines": page,
                "any_running": any(pipeline.is_running for pipeline in rows),
            }
        )
        return context

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        context = self.get_context_data(**kwargs)
        if request.headers.get("HX-Request"):
            etag = live.etag(
                "pipelines",
                context["pipelines"].number,
                *[(p.pk, p.state, p.updated_at) for p in context["pipelines"]],
            )
            return live.fragment_response(request, "pipelines/list.html#rows", context, etag)
        return self.render_to_response(context)


@method_decorator(vary_on_headers("HX-Request"), name="dispatch")  # fragments for htmx
class PipelineDetailView(WorkspaceViewMixin, TemplateView):
    """One pipeline: its state and why, its graph (a list on a narrow screen), its history,
    and the cancel and resume buttons of those allowed."""

    template_name = "pipelines/detail.html"

    def _context(self, pipeline: Pipeline) -> dict[str, Any]:
        stages, edges, graph = _drawn(pipeline)
        return {
            "pipeline": pipeline,
            "stages": stages,
            "edges": edges,
            "graph": graph,
            "box_width": BOX_WIDTH,
            "box_height": BOX_HEIGHT,
            "events": [
                (event, EVENT_WORDS.get(event.kind, event.kind))
                for event in PipelineEvent.objects.for_workspace(self.workspace)
                .filter(pipeline=pipeline)
                .order_by("-seq")[:EVENTS_SHOWN]
            ],
            "may_act": may_act_on(pipeline, access=self.access, user_id=self.request.user.pk),
            "resumable": pipeline.state in RESUMABLE,
        }

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        pipeline = pipeline_or_404(self.workspace, kwargs["name"])
        if request.headers.get("HX-Request"):
            etag = live.etag("pipeline", *_live_parts(pipeline))
            if live.not_modified(request, etag):
                return live.fragment_response(request, "pipelines/detail.html#live", {}, etag)
            context = {**self.get_context_data(**kwargs), **self._context(pipeline)}
            return live.fragment_response(request, "pipelines/detail.html#live", context, etag)
        context = {**self.get_context_data(**kwargs), **self._context(pipeline)}
        return self.render_to_response(context)


class PipelineActionView(WorkspaceViewMixin, View):
    """The page's Cancel and Resume buttons (a form post each); back to the page with what
    happened said."""

    action = ""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        pipeline = pipeline_or_404(self.workspace, kwargs["name"])
        if not may_act_on(pipeline, access=self.access, user_id=request.user.pk):
            raise PermissionDenied(REFUSAL)
        user = signed_in_user(request)
        try:
            if self.action == "cancel":
                done = orchestration.cancel_pipeline(pipeline=pipeline, user=user)
                said = (
                    f"Cancelling {pipeline.name}: its running stages are being stopped."
                    if done.state == PipelineState.RUNNING
                    else f"{pipeline.name} is cancelled."
                )
            else:
                done = orchestration.resume_pipeline(pipeline=pipeline, user=user)
                said = f"Resumed {pipeline.name}: it is {done.state}."
        except orchestration.PipelineActionRefused as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, said)
        return HttpResponseRedirect(
            reverse("pipeline-page", args=[self.workspace.slug, pipeline.name])
        )
