"""Who may act on a run (cancel it, resume it): its submitter, or a workspace admin.

Written once, for the run page's buttons, its form posts and the API's actions alike."""

from __future__ import annotations

from runs.models import Run
from workspaces.access import WorkspaceAccess
from workspaces.models import Role

REFUSAL = "Only its submitter or a workspace admin can do that."


def may_act_on(run: Run, *, access: WorkspaceAccess, user_id: int | None) -> bool:
    """Whether the caller (``user_id``, with ``access`` to the run's workspace) may cancel or
    resume ``run``: a workspace admin may act on any run, a researcher on their own."""
    if access.allows(Role.ADMIN):
        return True
    return access.allows(Role.RESEARCHER) and user_id is not None and run.submitted_by_id == user_id
