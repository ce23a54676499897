"""The run page's evidence section on its own: polled while a record is being sealed or
checked, and the "Check again" button."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views import View

from evidence import selectors, verification
from runs.models import Run
from workspaces.access import WorkspaceViewMixin
from workspaces.models import Role


def _run_or_404(view: WorkspaceViewMixin, name: str) -> Run:
    run = Run.objects.for_workspace(view.workspace).filter(name=name).first()
    if run is None:
        raise Http404("No such run in this workspace.")
    return run


class RunEvidenceView(WorkspaceViewMixin, View):
    """GET: the evidence section of the run page (the fragment it polls while sealing or
    checking). POST: check the record again, as it exports now. Checking changes nothing
    but the record's check result, so anyone who may read the run may ask for it."""

    write_role = Role.VIEWER

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        run = _run_or_404(self, kwargs["run_name"])
        response = render(
            request,
            "evidence/_run_evidence.html",
            {"run": run, "workspace": self.workspace, "access": self.access},
        )
        response["Cache-Control"] = "no-store"
        return response

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseRedirect:
        run = _run_or_404(self, kwargs["run_name"])
        record = selectors.current_record(run)
        if record is None:
            messages.error(request, f"{run.name} has no sealed evidence to check yet.")
        elif verification.request_verification(record):
            messages.success(request, f"Checking the evidence of {run.name} again.")
        else:
            messages.info(request, f"The evidence of {run.name} is being checked already.")
        page = reverse(
            "run-page", kwargs={"workspace_slug": self.workspace.slug, "run_name": run.name}
        )
        return HttpResponseRedirect(f"{page}#evidence-heading")
