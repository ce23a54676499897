"""What the portal's console log says about a request it refused, and about one that broke.

The console handler of the logging configuration in settings is used as it is, with its
stream pointed at a buffer for the length of a test.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from django.test import Client

from web import views

pytestmark = pytest.mark.django_db


@contextmanager
def console_log() -> Iterator[io.StringIO]:
    handler = next(h for h in logging.getLogger().handlers if h.name == "console")
    assert isinstance(handler, logging.StreamHandler)
    buffer = io.StringIO()
    previous = handler.setStream(buffer)
    try:
        yield buffer
    finally:
        handler.setStream(previous)


def test_a_refused_page_is_one_line_with_who_and_which_request(world: Any) -> None:
    client = world.client_for("researcher")
    with console_log() as log:
        response = client.get("/admin/login/", HTTP_X_REQUEST_ID="refused-request-0001")
    assert response.status_code == 403
    lines = log.getvalue().splitlines()
    assert len(lines) == 1, log.getvalue()
    line = lines[0]
    assert "WARNING django.request [refused-request-0001]" in line
    assert "GET /admin/login/ 403" in line
    assert "The platform admin is for platform staff." in line
    assert "user=rob" in line
    assert "Traceback" not in log.getvalue()


def test_a_missing_page_is_one_line_for_an_anonymous_visitor() -> None:
    with console_log() as log:
        response = Client().get("/no-such-page/")
    assert response.status_code == 404
    lines = log.getvalue().splitlines()
    assert len(lines) == 1, log.getvalue()
    assert "GET /no-such-page/ 404 Not Found user=anonymous" in lines[0]
    assert f"[{response['X-Request-ID']}]" in lines[0]


def test_a_refused_api_call_names_the_token_user(world: Any) -> None:
    client = world.api_client_for("viewer")
    with console_log() as log:
        response = client.patch("/api/v1/workspaces/alpha/", {"name": "Mine"}, format="json")
    assert response.status_code == 403
    lines = log.getvalue().splitlines()
    assert len(lines) == 1, log.getvalue()
    assert "PATCH /api/v1/workspaces/alpha/ 403 Forbidden user=vera" in lines[0]


def test_a_line_break_in_the_path_cannot_forge_a_second_line() -> None:
    with console_log() as log:
        Client().get("/nothing%0A2026-01-01 ERROR forged/")
    assert len(log.getvalue().splitlines()) == 1, log.getvalue()


def test_a_server_error_still_logs_its_traceback(world: Any) -> None:
    client = world.client_for("researcher")
    client.raise_request_exception = False
    with (
        mock.patch.object(views.HomeView, "get", side_effect=RuntimeError("the disk is on fire")),
        console_log() as log,
    ):
        response = client.get("/")
    assert response.status_code == 500
    text = log.getvalue()
    assert "ERROR django.request" in text
    assert "Traceback (most recent call last)" in text
    assert "RuntimeError: the disk is on fire" in text
