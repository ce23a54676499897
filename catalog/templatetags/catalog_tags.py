"""The run page's Data section reads what the run read and made here, and the workspace and
usage pages their storage line, so that those pages' own views (below the catalog) need to
know nothing about datasets or models."""

from __future__ import annotations

from django import template

from catalog import selectors
from catalog.ingest import storage_used
from runs.models import Run
from workspaces.models import Workspace

register = template.Library()


@register.simple_tag
def run_data(run: Run) -> selectors.RunData | None:
    """The dataset versions the run read and the versions it made (None: neither)."""
    return selectors.run_data(run)


@register.simple_tag
def storage_usage(workspace: Workspace) -> dict[str, int | None]:
    """Bytes the workspace's datasets and models keep (each file once, unfinished uploads'
    declared bytes counted), and its storage quota (None: none)."""
    used = storage_used(workspace.pk)
    quota = workspace.storage_quota_bytes
    percent = min(100, round(100 * used / quota)) if quota else None
    return {"used": used, "quota": quota, "percent": percent}
