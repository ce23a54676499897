"""``GET /api/v1/me/``: who a caller is and what its token may do (``tau whoami``,
``tau run list --mine``)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from identity import tokens
from tests.runs.factories import make_run
from tests.runs.test_api import bearer, run_token

pytestmark = pytest.mark.django_db

ME = "/api/v1/me/"


def test_a_token_says_whose_it_is_and_what_it_may_reach(world: Any) -> None:
    rob = world.users["researcher"]
    rob.first_name, rob.last_name = "Rob", "Stone"
    rob.save()
    issued = tokens.issue_token(user=rob, name="laptop", workspace=world.alpha, read_only=True)
    answer = bearer(issued.plaintext).get(ME).json()
    token = answer.pop("token")
    assert answer == {
        "username": "rob",
        "display_name": "Rob Stone",
        "email": "rob@example.org",
        "is_staff": False,
    }
    assert (token["name"], token["workspace"], token["read_only"]) == ("laptop", "alpha", True)
    assert token["expires_at"] == issued.token.expires_at.isoformat().replace("+00:00", "Z")


def test_a_session_has_no_token_and_staff_say_so(world: Any) -> None:
    answer = world.api_client_for("platform_admin").get(ME).json()
    assert (answer["username"], answer["is_staff"], answer["token"]) == ("platform", True, None)
    assert answer["display_name"] == "platform"  # no full name: the username


def test_nobody_and_a_run_token_are_refused(world: Any) -> None:
    assert APIClient().get(ME).status_code == 401
    ran = make_run(world)
    refused = bearer(run_token(world, ran)).get(ME)
    assert refused.status_code == 403
    assert refused.json()["detail"] == "This token can only report on its run."
