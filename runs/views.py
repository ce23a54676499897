"""Run pages: the list, submitting, one run (live), the queue.

One template renders a page and its fragments (template partials); HTMX requests and the
live pollers get the fragment. Live fragments carry an ETag: when nothing changed, the server
answers 304 after one small query, and the browser keeps what it shows.
"""

from __future__ import annotations

import platform
import re
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import (
    Count,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    prefetch_related_objects,
)
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
    QueryDict,
)
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.vary import vary_on_headers
from django.views.generic import TemplateView

from portal import live
from portal.requests import signed_in_user
from runs import bundles, compare, lifecycle, queueing, selectors, submission
from runs.access import REFUSAL, may_act_on
from runs.backends import QueueReading
from runs.backends.registry import backend_for_run, backend_named
from runs.checkpoints import checkpoint_exists
from runs.models import (
    LIVE_STATES,
    RUNNING_STATES,
    WAITING_STATES,
    Artifact,
    Backend,
    Checkpoint,
    MetricPoint,
    Run,
    RunAttempt,
    RunEvent,
    RunState,
    RunTrial,
)
from runs.policy import requested_totals
from runs.selectors import EXPERIMENT_FILTERS
from runs.state import RunActionRefused
from runs.trials import trials_table
from runs.usage import platform_usage, queue_estimate, usage_lines
from tau.quantity import format_quantity
from workspaces.access import StaffRequiredMixin, WorkspaceViewMixin
from workspaces.models import Role, Workspace

PAGE_SIZE = 25
#: Every filter; ``sort`` orders and does not filter.
FILTERS = ("state", "submitter", "q", *EXPERIMENT_FILTERS)
#: How many experiments the runs list names (the most recently used).
EXPERIMENTS_SHOWN = 12


@method_decorator(vary_on_headers("HX-Request"), name="dispatch")  # fragments for htmx
class RunListView(WorkspaceViewMixin, TemplateView):
    """Runs of the workspace: filters, search, newest or oldest first, keyset pages."""

    template_name = "runs/list.html"

    def _runs(self) -> tuple[QuerySet[Run], dict[str, str]]:
        params = self.request.GET
        filters = {
            "state": params.get("state", ""),
            "submitter": params.get("submitter", "").strip(),
            "q": params.get("q", "").strip(),
            "project": params.get("project", "").strip(),
            "experiment": params.get("experiment", "").strip(),
            "group": params.get("group", "").strip(),
            "sort": "oldest" if params.get("sort") == "oldest" else "newest",
        }
        for name in ("submitter", "q", *EXPERIMENT_FILTERS):
            if "\x00" in filters[name]:  # no name has one, and the database refuses it
                self.refused = f"{name}: a search cannot contain NUL characters; it is ignored."
                filters[name] = ""
        runs = Run.objects.for_workspace(self.workspace)
        if filters["state"] == "live":
            runs = runs.filter(state__in=LIVE_STATES)
        elif filters["state"] in RunState.values:
            runs = runs.filter(state=filters["state"])
        else:
            filters["state"] = ""
        if filters["submitter"]:
            runs = runs.filter(submitted_by_username=filters["submitter"])
        if filters["q"]:
            runs = runs.filter(
                Q(name__startswith=filters["q"]) | Q(spec_name__startswith=filters["q"])
            )
        for name, column in EXPERIMENT_FILTERS.items():
            if filters[name]:
                runs = runs.filter(**{column: filters[name]})
        return runs, filters

    def _experiments(self) -> list[dict[str, Any]]:
        """The workspace's experiments (project, name, group) with their run counts, the
        most recently used first: one grouped query."""
        rows = (
            Run.objects.for_workspace(self.workspace)
            .exclude(experiment_project="", experiment_name="", experiment_group="")
            .values("experiment_project", "experiment_name", "experiment_group")
            .annotate(runs=Count("id"), latest=Max("created_at"))
            .order_by("-latest")[:EXPERIMENTS_SHOWN]
        )
        experiments = []
        for row in rows:
            query = QueryDict(mutable=True)
            for name, column in EXPERIMENT_FILTERS.items():
                if row[column]:
                    query[name] = row[column]
            experiments.append(
                {
                    "project": row["experiment_project"],
                    "name": row["experiment_name"],
                    "group": row["experiment_group"],
                    "runs": row["runs"],
                    "query": query.urlencode(),
                }
            )
        return experiments

    refused = ""  # what was wrong with the address, shown with the first page (a 400)

    def _cursor(self) -> tuple[datetime | None, int]:
        """Where the page starts (``after=<created_at>_<id>``, as the previous page's link
        says), or (None, 0) for the first page, also when the cursor is not one this page
        gave out: then ``refused`` says so, and the answer is a 400 showing the first page."""
        cursor = self.request.GET.get("after", "")
        if not cursor:
            return None, 0
        created, _, pk = cursor.partition("_")
        try:
            when = parse_datetime(created)
            if when is None or not re.fullmatch(r"[0-9]{1,19}", pk):
                raise ValueError("not <time>_<id>")
            if timezone.is_naive(when):
                when = timezone.make_aware(when, UTC)
            when.astimezone(UTC)  # a time the database can compare with
        except (ValueError, OverflowError):
            self.refused = (
                f"The page address is damaged (after={cursor[:80]!r} is not where a page of "
                "runs starts); this is the first page."
            )
            return None, 0
        return when, int(pk)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        runs, filters = self._runs()
        newest_first = filters["sort"] == "newest"
        cursor_time, pk = self._cursor()
        if cursor_time is not None:
            # Keyset pagination: the next page starts after the last row shown.
            if newest_first:
                runs = runs.filter(
                    Q(created_at__lt=cursor_time) | Q(created_at=cursor_time, id__lt=pk)
                )
            else:
                runs = runs.filter(
                    Q(created_at__gt=cursor_time) | Q(created_at=cursor_time, id__gt=pk)
                )
        order = ("-created_at", "-id") if newest_first else ("created_at", "id")
        page = list(runs.order_by(*order)[: PAGE_SIZE + 1])
        has_more = len(page) > PAGE_SIZE
        page = page[:PAGE_SIZE]
        # The backends' own positions for the queued runs shown (Kueue's: one call at most).
        reading = queueing.read_positions(self.workspace, page)
        queueing.apply_positions(page, reading)
        next_query = None
        if has_more:
            last = page[-1]
            query = self.request.GET.copy()
            query["after"] = f"{last.created_at.isoformat()}_{last.pk}"
            next_query = query.urlencode()
        context.update(
            {
                "runs": page,
                "filters": filters,
                "states": RunState.choices,
                "next_query": next_query,
                "any_live": any(run.state in LIVE_STATES for run in page),
                "filtered": any(filters[name] for name in FILTERS),
                # The live poller asks for the rows only.
                "experiments": []
                if self.request.headers.get("HX-Request")
                else self._experiments(),
                "queue_note": reading.unavailable,
            }
        )
        return context

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        context = self.get_context_data(**kwargs)
        if self.refused:
            messages.error(request, self.refused)
            return self.render_to_response(context, status=400)
        if request.headers.get("HX-Request"):
            rows = context["runs"]
            etag = live.etag(
                "list", *[(r.pk, r.state, r.attempt_count, r.queue_position) for r in rows]
            )
            return live.fragment_response(request, "runs/list.html#rows", context, etag)
        return self.render_to_response(context)


def _is_sweep(run: Run) -> bool:
    execution = run.spec.get("execution") if isinstance(run.spec, dict) else None
    return isinstance(execution, dict) and execution.get("launcher") == "ray-tune"


def _planned_trials(execution: dict[str, Any]) -> int:
    grid = 1
    for value in (execution.get("configs") or {}).values():
        grid *= len(value) if isinstance(value, list) else 1
    return grid * int(execution.get("num_samples") or 1)


def _run_or_404(workspace: Any, run_name: str) -> Run:
    return selectors.resolve_run(workspace, run_name)


@method_decorator(vary_on_headers("HX-Request"), name="dispatch")  # fragments for htmx
class RunDetailView(WorkspaceViewMixin, TemplateView):
    """One run: state in plain words, timeline, log, charts, checkpoints, attempts, actions."""

    template_name = "runs/detail.html"

    def _queue(self, run: Run) -> QueueReading:
        """The backend's position of the run, when it keeps one (Kueue's: one call)."""
        reading = queueing.read_positions(self.workspace, [run])
        queueing.apply_positions([run], reading)
        return reading

    def _context(self, run: Run, reading: QueueReading) -> dict[str, Any]:
        attempts = list(
            RunAttempt.objects.for_workspace(self.workspace)
            .filter(run=run)
            .select_related("resume_from")
            .order_by("-number")
        )
        events = list(
            RunEvent.objects.for_workspace(self.workspace).filter(run=run).order_by("-seq")[:50]
        )
        checkpoints = list(
            Checkpoint.objects.for_workspace(self.workspace).filter(run=run).order_by("-step")[:20]
        )
        for checkpoint in checkpoints:
            checkpoint.available = checkpoint_exists(run, checkpoint)  # type: ignore[attr-defined]
        artifacts = list(
            Artifact.objects.for_workspace(self.workspace).filter(run=run).order_by("path")[:200]
        )
        may_act = may_act_on(run, access=self.access, user_id=self.request.user.pk)
        latest = attempts[0] if attempts else None
        # ?attempt=N shows that attempt's log (the page works without JavaScript too); the
        # newest, or a number the run does not have, follows the newest.
        chosen = self.request.GET.get("attempt", "")
        log_attempt = next((a for a in attempts if str(a.number) == chosen), latest)
        return {
            "run": run,
            "attempts": attempts,
            "events": events,
            "checkpoints": checkpoints,
            "artifacts": artifacts,
            "is_live": run.is_live,
            "can_cancel": may_act and run.is_live and run.state != RunState.CANCELLING,
            "can_resume": may_act and not run.is_live,
            "latest_attempt": latest,
            "log_attempt": log_attempt,
            "log_follows_newest": log_attempt is latest,
            "queue_note": reading.unavailable,
            **self._sweep(run),
        }

    def _sweep(self, run: Run) -> dict[str, Any]:
        if not _is_sweep(run):
            return {}
        names, rows = trials_table(run, run.spec)
        execution = run.spec["execution"]
        return {
            "sweep": {
                "metric": execution["metric"],
                "mode": execution["mode"],
                "max_concurrent_trials": execution["max_concurrent_trials"],
                "planned": _planned_trials(execution),
                "names": names,
                "rows": rows,
            }
        }

    def _version(self, run: Run) -> tuple[Any, ...]:
        """Everything the live fragment shows changes one of these: the run row (state,
        reason, attempts), its newest event (workload events do not touch the run row), its
        newest checkpoint, its newest artifact."""
        newest_event = (
            RunEvent.objects.filter(run=OuterRef("pk")).order_by("-seq").values("seq")[:1]
        )
        newest_checkpoint = (
            Checkpoint.objects.filter(run=OuterRef("pk")).order_by("-id").values("id")[:1]
        )
        newest_artifact = (
            Artifact.objects.filter(run=OuterRef("pk")).order_by("-id").values("id")[:1]
        )
        annotations: dict[str, Any] = {
            "event": Subquery(newest_event),
            "checkpoint": Subquery(newest_checkpoint),
            "artifact": Subquery(newest_artifact),
        }
        if _is_sweep(run):
            # A sweep's trials table: trials start and end, and their best values move.
            trials = RunTrial.objects.filter(run=OuterRef("pk"))
            points = MetricPoint.objects.filter(run=OuterRef("pk"))
            annotations["trial"] = Subquery(trials.order_by("-started_at").values("started_at")[:1])
            annotations["trial_end"] = Subquery(
                trials.exclude(finished_at=None).order_by("-finished_at").values("finished_at")[:1]
            )
            annotations["point"] = Subquery(points.order_by("-id").values("id")[:1])
        row = (
            Run.objects.for_workspace(self.workspace)
            .filter(pk=run.pk)
            .annotate(**annotations)
            .values_list("updated_at", "state", *annotations)
            .get()
        )
        return (run.pk, *row)

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        run = _run_or_404(self.workspace, kwargs["run_name"])
        if run.name != kwargs["run_name"]:
            # Named by its spec: show the run's own address.
            return HttpResponseRedirect(
                reverse(
                    "run-page", kwargs={"workspace_slug": self.workspace.slug, "run_name": run.name}
                )
            )
        # A queued Kubernetes run's place is Kueue's to say, at this moment (one call).
        reading = self._queue(run)
        if request.headers.get("HX-Request"):
            # The live part polls: answer "nothing changed" after one small query.
            etag = live.etag(
                "run", *self._version(run), reading.position(run.pk), reading.unavailable
            )
            if live.not_modified(request, etag):
                return live.fragment_response(request, "runs/detail.html#live", {}, etag)
            context = {**self.get_context_data(**kwargs), **self._context(run, reading)}
            return live.fragment_response(request, "runs/detail.html#live", context, etag)
        context = {**self.get_context_data(**kwargs), **self._context(run, reading)}
        return self.render_to_response(context)


class RunActionView(WorkspaceViewMixin, View):
    """Cancel or resume from the run page (a form post; the page asks for confirmation)."""

    write_role = Role.RESEARCHER
    action = ""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        run = _run_or_404(self.workspace, kwargs["run_name"])
        if not may_act_on(run, access=self.access, user_id=request.user.pk):
            raise PermissionDenied(REFUSAL)
        try:
            if self.action == "cancel":
                cancelled = lifecycle.cancel_run(run=run, user=signed_in_user(request))
                # Say what is true now: a run that was only waiting is cancelled already.
                if cancelled.state == RunState.CANCELLED:
                    messages.success(request, f"Cancelled {run.name}.")
                else:
                    messages.success(request, f"Cancelling {run.name}: stopping its processes.")
            else:
                checkpoint = None
                if request.POST.get("checkpoint", "").isdigit():
                    checkpoint = (
                        Checkpoint.objects.for_workspace(self.workspace)
                        .filter(run=run, pk=int(request.POST["checkpoint"]))
                        .first()
                    )
                    if checkpoint is None:
                        raise Http404("No such checkpoint of this run.")
                lifecycle.resume_run(run=run, user=signed_in_user(request), checkpoint=checkpoint)
                where = f" from step {checkpoint.step}" if checkpoint else ""
                messages.success(request, f"Resuming {run.name}{where}.")
        except RunActionRefused as exc:
            messages.error(request, str(exc))
        return HttpResponseRedirect(
            reverse(
                "run-page", kwargs={"workspace_slug": self.workspace.slug, "run_name": run.name}
            )
        )


@method_decorator(vary_on_headers("HX-Request"), name="dispatch")  # fragments for htmx
class SubmitView(WorkspaceViewMixin, TemplateView):
    """Upload or paste a tau.yaml (and a project zip); it is checked as you type.

    With JavaScript the form is sent by htmx: a refused submission swaps the problems in and
    the chosen files stay chosen. Without it, the page comes back with the problems and the
    spec text, and says that the zip must be chosen again (browsers clear file fields)."""

    template_name = "runs/submit.html"
    read_role = Role.RESEARCHER

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["local"] = settings.TAU_BACKEND == Backend.LOCAL
        return context

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            submission.count_submission(user_id=signed_in_user(request).pk, token_key=None)
        except submission.TooManySubmissions as exc:
            return _too_many(request, exc, self, kwargs)
        source = _spec_source(request)
        bundle = request.FILES.get("bundle")
        try:
            run = submission.submit(
                workspace=self.workspace,
                user=signed_in_user(request),
                spec_source=source,
                bundle=bundle,
            )
        except submission.SubmissionRefused as exc:
            if request.headers.get("HX-Request"):
                context = {"workspace": self.workspace, "problems": exc.problems, "refused": True}
                return render(request, "runs/submit.html#validation", context, status=400)
            context = self.get_context_data(**kwargs)
            context.update(
                {
                    "problems": exc.problems,
                    "refused": True,
                    "spec_text": source.decode("utf-8", "replace"),
                    "bundle_cleared": bundle.name if bundle is not None else None,
                }
            )
            return self.render_to_response(context, status=400)
        messages.success(request, f"Submitted {run.name}.")
        storage_warning = backend_for_run(run).storage_warning(self.workspace)
        if storage_warning:
            messages.warning(request, storage_warning)
        url = reverse(
            "run-page", kwargs={"workspace_slug": self.workspace.slug, "run_name": run.name}
        )
        if request.headers.get("HX-Request"):
            response = HttpResponse(status=204)
            response["HX-Redirect"] = url
            return response
        return HttpResponseRedirect(url)


def _too_many(
    request: HttpRequest,
    refused: submission.TooManySubmissions,
    page: SubmitView | None = None,
    kwargs: dict[str, Any] | None = None,
) -> HttpResponse:
    """429 with ``Retry-After``: where the check is (htmx, or the live check), or the submit
    page again with what was typed (without JavaScript)."""
    problem = submission.SubmissionProblem("submission", str(refused))
    context: dict[str, Any] = {"problems": [problem], "refused": page is not None}
    if page is not None and not request.headers.get("HX-Request"):
        context = {
            **page.get_context_data(**(kwargs or {})),
            **context,
            "spec_text": request.POST.get("spec_text", ""),
        }
        response = page.render_to_response(context, status=429)
    else:
        response = render(request, "runs/submit.html#validation", context, status=429)
    response["Retry-After"] = str(refused.wait)
    return response


def _spec_source(request: HttpRequest) -> bytes:
    upload = request.FILES.get("spec_file")
    if upload is not None:
        return bytes(upload.read(submission.MAX_SPEC_BYTES + 1))
    return request.POST.get("spec_text", "").encode("utf-8")


def _bundle_listing(request: HttpRequest) -> tuple[str, bundles.BundleListing | None]:
    """What the submit page read from the chosen zip in the browser (``bundle_files``, one
    name per line): ("none", None) when no zip is chosen, ("unread", None) when the browser
    could not list it (the server checks it at submission), else ("read", listing)."""
    status = request.POST.get("bundle_status", "")
    if status == "unread":
        return "unread", None
    if status != "read":
        return "none", None
    # Form submission sends line breaks as CRLF.
    names = request.POST.get("bundle_files", "").splitlines()[: bundles.MAX_FILES]
    return "read", bundles.BundleListing.from_names(names)


class ValidateView(WorkspaceViewMixin, View):
    """The submit page's live check: problems at their lines, or a preview of what happens."""

    read_role = Role.RESEARCHER
    write_role = Role.RESEARCHER

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            submission.count_submission(
                user_id=signed_in_user(request).pk, token_key=None, check=True
            )
        except submission.TooManySubmissions as exc:
            return _too_many(request, exc)
        source = _spec_source(request)
        context: dict[str, Any] = {"workspace": self.workspace}
        if not source.strip():
            context["empty"] = True
            return render(request, "runs/submit.html#validation", context)
        try:
            placement = submission.check_spec(source, workspace=self.workspace)
        except submission.SubmissionRefused as exc:
            context["problems"] = exc.problems
            return render(request, "runs/submit.html#validation", context)
        bundle_status, listing = _bundle_listing(request)
        unwrap = None
        if bundle_status != "unread":
            problems, unwrap = submission.check_bundle(placement.spec, listing, source=source)
            if problems:
                context["problems"] = problems
                return render(request, "runs/submit.html#validation", context)
        position = (
            Run.objects.for_workspace(self.workspace).filter(state=RunState.QUEUED).count() + 1
        )
        estimate = queue_estimate(self.workspace)
        reading = submission.reading_of(source)
        context.update(
            {
                "spec": placement.spec,
                "reading": reading,
                "priority": placement.priority,
                "cost": placement.cost,
                "local": settings.TAU_BACKEND == Backend.LOCAL,
                "python_version": platform.python_version(),
                "totals": [
                    (resource, format_quantity(amount, binary=resource == "memory"))
                    for resource, amount in requested_totals(placement.spec).items()
                    if amount
                ],
                "bundle_status": bundle_status,
                "bundle_files": len(listing.files) if listing is not None else 0,
                "unwrap": unwrap,
                "position": position,
                "estimate": estimate,
                "starts_in": estimate.start_after(position - 1) if position > 1 else None,
                "storage_warning": backend_named(settings.TAU_BACKEND).storage_warning(
                    self.workspace
                ),
            }
        )
        return render(request, "runs/submit.html#validation", context)


@method_decorator(vary_on_headers("HX-Request"), name="dispatch")  # fragments for htmx
class QueueView(WorkspaceViewMixin, TemplateView):
    """Use against quota, pending runs in order with reason and estimate, running runs."""

    template_name = "runs/queue.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        runs = Run.objects.for_workspace(self.workspace)
        # Waiting: pending, queued, and put back by the platform (preempted, evicted), each
        # with its reason.
        pending = list(
            runs.filter(state__in=WAITING_STATES).order_by(
                "queue_position", "-priority_value", "queued_at", "id"
            )[:200]
        )
        # Queued runs in their backend's order (Kueue's: one call for the workspace's
        # LocalQueue); the others keep TauGrid's after them.
        reading = queueing.read_positions(self.workspace, pending)
        queueing.apply_positions(pending, reading)
        pending.sort(key=lambda run: (run.queue_position is None, run.queue_position or 0))
        running = list(runs.filter(state__in=RUNNING_STATES).order_by("admitted_at")[:200])
        estimate = queue_estimate(self.workspace)
        now = timezone.now()
        context.update(
            {
                "usage": usage_lines(self.workspace),
                "pending": [
                    (
                        run,
                        estimate.start_after(
                            run.queue_position - 1 if run.queue_position else None
                        ),
                    )
                    for run in pending
                ],
                "running": running,
                "estimate": estimate,
                "now": now,
                "is_live": bool(pending or running),
                "queue_note": reading.unavailable,
            }
        )
        return context

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        context = self.get_context_data(**kwargs)
        if request.headers.get("HX-Request"):
            etag = live.etag(
                "queue",
                *[
                    (run.pk, run.state, run.queue_position, run.state_reason)
                    for run, _ in context["pending"]
                ],
                *[(run.pk, run.state) for run in context["running"]],
                *[(line.resource, line.used) for line in context["usage"]],
                context["queue_note"],
            )
            return live.fragment_response(request, "runs/queue.html#live", context, etag)
        return self.render_to_response(context)


class PlatformQueueView(StaffRequiredMixin, TemplateView):
    """Every workspace's queue and use of quota, for platform staff."""

    template_name = "runs/platform_queue.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        # unscoped(): the platform team's view across all workspaces.
        live = list(
            Run.objects.unscoped()
            .filter(state__in=LIVE_STATES)
            .select_related("workspace")
            .order_by("workspace__slug", "queue_position", "-priority_value", "queued_at", "id")[
                :1000
            ]
        )
        usage = platform_usage()
        workspaces = Workspace.objects.unscoped().filter(active=True).order_by("slug")
        rows: list[dict[str, Any]] = []
        notes: list[str] = []
        for workspace in workspaces:
            mine = [run for run in live if run.workspace_id == workspace.pk]
            # The backends' positions (Kueue's: one call per LocalQueue with queued runs).
            reading = queueing.read_positions(workspace, mine)
            queueing.apply_positions(mine, reading)
            if reading.unavailable:
                notes.append(f"{workspace.slug}: {reading.unavailable}")
            rows.append(
                {
                    "workspace": workspace,
                    "usage": usage.get(workspace.pk, []),
                    "waiting": [run for run in mine if run.state in WAITING_STATES],
                    "running": [run for run in mine if run.state in RUNNING_STATES],
                }
            )
        context.update(
            {
                "rows": rows,
                "waiting_total": sum(len(row["waiting"]) for row in rows),
                "running_total": sum(len(row["running"]) for row in rows),
                "queue_notes": notes,
            }
        )
        return context


class RunCompareView(WorkspaceViewMixin, TemplateView):
    """Two runs of the workspace side by side (``?a=<run>&b=<run>``, or two ``run`` values
    as the runs list's checkboxes send them, the older then A): outcome, spec, code,
    environment, and their metric curves over each other. Without two runs, a form to choose
    them; a name that is no run of this workspace is said so (404), reading nothing of any
    other."""

    template_name = "runs/compare.html"

    def _names(self) -> tuple[str, str]:
        params = self.request.GET
        chosen = [name.strip() for name in params.getlist("run") if name.strip()]
        a = params.get("a", "").strip() or (chosen[0] if chosen else "")
        b = params.get("b", "").strip() or (chosen[1] if len(chosen) > 1 else "")
        return a, b

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        context = self.get_context_data(**kwargs)
        a_name, b_name = self._names()
        context.update({"a_name": a_name, "b_name": b_name})
        context["recent"] = list(
            Run.objects.for_workspace(self.workspace)
            .order_by("-created_at", "-id")
            .values_list("name", flat=True)[:50]
        )
        if len(self.request.GET.getlist("run")) > 2:
            context["problem"] = "Choose two runs to compare, not more."
            return self.render_to_response(context, status=400)
        if not (a_name and b_name):
            return self.render_to_response(context)
        found: dict[str, Run] = {}
        for name in (a_name, b_name):
            try:
                found[name] = selectors.resolve_run(self.workspace, name)
            except Http404:
                context["problem"] = f"There is no run called {name!r} in {self.workspace.name}."
                return self.render_to_response(context, status=404)
        a, b = found[a_name], found[b_name]
        if not self.request.GET.get("a"):
            # Chosen in the runs list (newest first): the older is A, what the newer is compared to.
            a, b = sorted((a, b), key=lambda run: (run.created_at, run.pk))
        # The form shows the runs as compared: A in the A field (the list sends them newest
        # first), each by its own name (a spec name finds its newest run).
        context.update({"a_name": a.name, "b_name": b.name})
        prefetch_related_objects([a, b], "bundle")  # one query for both
        attempts: dict[int, list[RunAttempt]] = {a.pk: [], b.pk: []}
        for attempt in (
            RunAttempt.objects.for_workspace(self.workspace)
            .filter(run__in=[a, b])
            .order_by("run_id", "number")
        ):
            attempts[attempt.run_id].append(attempt)
        newest = {run_id: held[-1] for run_id, held in attempts.items() if held}
        now = timezone.now()
        context.update(
            {
                "a": a,
                "b": b,
                "outcomes": (
                    compare.outcome(a, attempts[a.pk], now=now),
                    compare.outcome(b, attempts[b.pk], now=now),
                ),
                "spec_differences": compare.spec_differences(a.spec, b.spec),
                "spec_diff": compare.spec_diff(a, b),
                "code_changes": compare.code_changes(a, b),
                "environment_differences": compare.environment_differences(
                    a, newest.get(a.pk), b, newest.get(b.pk)
                ),
            }
        )
        return self.render_to_response(context)
