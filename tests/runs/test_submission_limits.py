"""What one submission may cost, and how many there may be (issue 30): a tau.yaml of 20,000
unknown keys is refused after its first ``MAX_NODES`` nodes with one problem (it cost 4 s
of CPU and answered 101 problems), and submissions are limited per token and per user, the
submit page's live check per user, each with a 429 that says when to try again and before
any of the request is read."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from identity import tokens
from runs.models import Run
from tests.runs.factories import TINY_FILES, TINY_SPEC, zip_bytes
from tests.runs.test_api import RUNS, bearer
from tests.spec.test_loader import the_attack_of_issue_30

pytestmark = pytest.mark.django_db


def token_for(world: Any, who: str = "researcher") -> str:
    issued = tokens.issue_token(user=world.users[who], name="ci", expires_in_days=1)
    return issued.plaintext


def api_submit(client: Any, spec: bytes = TINY_SPEC) -> Any:
    payload = {
        "spec": SimpleUploadedFile("tau.yaml", spec),
        "bundle": SimpleUploadedFile("project.zip", zip_bytes(TINY_FILES)),
    }
    return client.post(RUNS, payload, format="multipart")


def test_a_spec_of_twenty_thousand_unknown_keys_is_one_problem(world: Any) -> None:
    spec = the_attack_of_issue_30().encode()
    response = api_submit(bearer(token_for(world)), spec)
    assert response.status_code == 400
    [problem] = response.json()["problems"]
    assert problem["message"] == "the file holds more than 4,000 keys, values and list items"
    assert Run.objects.for_workspace(world.alpha).count() == 0


def test_submissions_are_limited_per_token(world: Any, settings: Any) -> None:
    settings.TAU_SUBMISSIONS_PER_MINUTE = 3
    settings.TAU_SUBMISSIONS_PER_MINUTE_PER_USER = 100
    client = bearer(token_for(world))
    assert [api_submit(client).status_code for _ in range(3)] == [201, 201, 201]
    refused = api_submit(client)
    assert refused.status_code == 429
    assert refused["Retry-After"] == "30"
    detail = refused.json()["detail"]
    assert detail.startswith(
        "More than 3 submissions a minute with this token; this run was not submitted. "
        "Try again in 30 seconds."
    )
    assert Run.objects.for_workspace(world.alpha).count() == 3
    # A refused submission was not read: an invalid spec gets the same 429, not a 400.
    assert api_submit(client, b"not: [a spec").status_code == 429
    # Another token of the same user has a limit of its own.
    assert api_submit(bearer(token_for(world))).status_code == 201


def test_making_tokens_does_not_multiply_a_users_limit(world: Any, settings: Any) -> None:
    settings.TAU_SUBMISSIONS_PER_MINUTE = 100
    settings.TAU_SUBMISSIONS_PER_MINUTE_PER_USER = 4
    statuses = [api_submit(bearer(token_for(world))).status_code for _ in range(5)]
    assert statuses == [201, 201, 201, 201, 429]
    refused = api_submit(bearer(token_for(world)))
    assert "More than 4 submissions a minute by you" in refused.json()["detail"]
    # Other people are not affected.
    assert api_submit(bearer(token_for(world, "workspace_admin"))).status_code == 201


def test_the_submit_page_is_limited_too(world: Any, settings: Any) -> None:
    settings.TAU_SUBMISSIONS_PER_MINUTE = 1
    browser = Client()
    browser.force_login(world.users["researcher"])
    url = reverse("run-submit", kwargs={"workspace_slug": "alpha"})
    form = {"spec_text": TINY_SPEC.decode(), "bundle": SimpleUploadedFile("p.zip", b"x")}
    assert browser.post(url, form).status_code == 400  # checked: the zip is no zip
    form["bundle"] = SimpleUploadedFile("p.zip", b"x")
    htmx = browser.post(url, form, HTTP_HX_REQUEST="true")
    assert htmx.status_code == 429
    assert htmx["Retry-After"] == "30"
    text = htmx.content.decode()
    assert "More than 1 submissions a minute from the portal&#x27;s pages" in text
    assert "Try again in 30 seconds." in text
    # Without JavaScript: the page again, with what was typed.
    form["bundle"] = SimpleUploadedFile("p.zip", b"x")
    page = browser.post(url, form)
    assert page.status_code == 429
    assert "name: tiny" in page.content.decode()
    assert re.search(r"Not submitted: 1 problem", page.content.decode())


def test_the_live_check_is_limited_per_user(world: Any, settings: Any) -> None:
    settings.TAU_SUBMIT_CHECKS_PER_MINUTE = 2
    browser = Client()
    browser.force_login(world.users["researcher"])
    url = reverse("run-validate", kwargs={"workspace_slug": "alpha"})
    for _ in range(2):
        assert browser.post(url, {"spec_text": TINY_SPEC.decode()}).status_code == 200
    refused = browser.post(url, {"spec_text": TINY_SPEC.decode()}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 429
    assert "More than 2 checks of a tau.yaml a minute by you; nothing was checked." in (
        refused.content.decode()
    )
