"""Who may act on an endpoint (scale it, update it, stop it, delete it): the one who deployed
it, while still a researcher of its workspace, or a workspace admin.

Written once, for the API's changes and the endpoint page's buttons and form posts alike."""

from __future__ import annotations

from serving.models import Endpoint
from workspaces.access import WorkspaceAccess
from workspaces.models import Role

REFUSAL = "Only the one who deployed it or a workspace admin can do that."


def may_act_on(endpoint: Endpoint, *, access: WorkspaceAccess, user_id: int | None) -> bool:
    """Whether the caller (``user_id``, with ``access`` to the endpoint's workspace) may
    change ``endpoint``: a workspace admin any endpoint, a researcher the ones they deployed."""
    if access.allows(Role.ADMIN):
        return True
    return (
        access.allows(Role.RESEARCHER) and user_id is not None and endpoint.created_by_id == user_id
    )
