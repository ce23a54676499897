"""How long an authenticated API request spends in token authentication.

Measures ``BearerTokenAuthentication.authenticate`` alone (token lookup in PostgreSQL, the
HMAC check, the rate-limit check in Redis) and, for scale, a whole request to a small
endpoint with the same token.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import django_test_database, measure, report


def main() -> None:
    with django_test_database():
        from django.contrib.auth import get_user_model
        from rest_framework.request import Request
        from rest_framework.test import APIClient, APIRequestFactory

        from identity.tokens import BearerTokenAuthentication, issue_token
        from workspaces.models import Membership, Workspace

        user = get_user_model().objects.create_user(username="bench")
        workspace = Workspace.unscoped_objects.create(
            slug="bench", name="Bench", namespace="tau-bench", local_queue="bench"
        )
        Membership.objects.create(workspace=workspace, user=user, role="researcher")
        plaintext = issue_token(user=user, name="bench").plaintext
        factory = APIRequestFactory()
        authenticator = BearerTokenAuthentication()

        def authenticate() -> None:
            request = Request(
                factory.get("/api/v1/workspaces/", HTTP_AUTHORIZATION=f"Bearer {plaintext}")
            )
            assert authenticator.authenticate(request) is not None

        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")

        def whole_request() -> None:
            assert client.get("/api/v1/workspaces/bench/").status_code == 200

        report(
            "token_auth",
            {
                "authenticate": measure(authenticate, iterations=2000),
                "whole_request_GET_workspace": measure(whole_request, iterations=500),
            },
        )


if __name__ == "__main__":
    main()
