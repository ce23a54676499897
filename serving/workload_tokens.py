"""Endpoint tokens: the credential an endpoint's pods fetch what it was deployed with
(``TAU_RUN_TOKEN`` in their init containers, the name the fetcher and the stager read).

An endpoint token belongs to the endpoint it was issued for (``Endpoint.token``), as a run
token belongs to its attempt (``runs.run_tokens``): it reaches that endpoint's workload routes
only — its project zip (``…/endpoints/{name}/bundle/``), the listing and files of the model
version it serves (``…/model/``, ``…/model/blobs/{sha256}/``) and the stager's report
(``…/report/model-staged/``) — and every other route of the API refuses it
(``identity.tokens.TokenScopePermission``; the views are ``serving.api.workload``). An
endpoint holds one token at a time: issuing another revokes the one before. It is revoked when
the endpoint is stopped or deleted (``serving.services``).

An endpoint runs until it is stopped, so its token lasts as long as the token policy allows
(``TAU_TOKEN_MAX_DAYS``); the Kubernetes backend issues a new one at each deployment of a
generation (a deployment, an update, a scale), which keeps a token's life within that limit
for an endpoint that changes, and puts it in the endpoint's Secret. Issuing and revoking go
through here only, so each is audited (``token.create`` with the endpoint, ``token.revoke``).
The plaintext goes to the endpoint's Secret and nowhere else; it is never logged.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from identity.models import ApiToken
from identity.tokens import issue_token, revoke_token
from serving.models import Endpoint, EndpointState
from serving.state import lock_endpoint

__all__ = ["issue_endpoint_token", "lifetime_days", "revoke_endpoint_tokens"]


def lifetime_days() -> int:
    """Days an endpoint token lasts: as long as the token policy allows (an endpoint has no
    deadline)."""
    return int(settings.TAU_TOKEN_MAX_DAYS)


def issue_endpoint_token(endpoint: Endpoint) -> str | None:
    """A token that reaches only this endpoint's workload routes; its plaintext, to put in
    the endpoint's Kubernetes Secret, nowhere else. None when the user who deployed it can no
    longer act (a token never does more than its user may), and when the endpoint is stopped
    or deleted (nothing of it should run, and a stop revokes its token: issued under the
    endpoint's row lock, a token cannot outlive a stop that happens meanwhile). The token the
    endpoint held before is revoked (one live token per endpoint)."""
    with transaction.atomic():
        locked = lock_endpoint(endpoint.pk)
        user = locked.created_by
        if user is None or not user.is_active:
            return None
        if locked.deleted_at is not None or locked.state == EndpointState.STOPPED:
            return None
        _revoke_held(locked)
        issued = issue_token(
            user=user,
            name=f"endpoint {locked.name} generation {locked.generation}",
            kind=ApiToken.Kind.ENDPOINT,
            workspace=locked.workspace,
            expires_in_days=lifetime_days(),
            details={"endpoint": locked.name},
        )
        Endpoint.objects.unscoped().filter(pk=locked.pk).update(token=issued.token)
        endpoint.token = issued.token
    return issued.plaintext


def revoke_endpoint_tokens(endpoint: Endpoint) -> int:
    """Revoke the live token the endpoint holds. How many were revoked (0 or 1)."""
    with transaction.atomic():
        return _revoke_held(endpoint)


def _revoke_held(endpoint: Endpoint) -> int:
    held = Endpoint.objects.unscoped().filter(pk=endpoint.pk, token__isnull=False)
    tokens = ApiToken.objects.select_related("user", "workspace").filter(
        pk__in=held.values("token_id"), revoked_at__isnull=True
    )
    revoked = 0
    for token in tokens:
        revoke_token(token=token)
        revoked += 1
    return revoked
