"""/healthz and /readyz, against the real database and broker, and with each of them down."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client, override_settings

from tests.runs.processes import free_port


def test_healthz_answers_without_touching_anything() -> None:
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_with_database_and_broker_up() -> None:
    response = Client().get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "broker": "ok"}}


@pytest.mark.django_db
def test_readyz_when_the_broker_is_down() -> None:
    port = free_port()  # nothing listens there
    with override_settings(CELERY_BROKER_URL=f"redis://127.0.0.1:{port}/0"):
        response = Client().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body == {
        "status": "unavailable",
        "down": ["broker"],
        "checks": {"database": "ok", "broker": "down"},
    }
    assert str(port) not in response.content.decode()


@pytest.mark.django_db
def test_readyz_when_the_filesystem_broker_folder_is_gone(tmp_path: Any) -> None:
    options = {"data_folder_in": str(tmp_path / "missing"), "processed_folder": str(tmp_path)}
    with override_settings(
        CELERY_BROKER_URL="filesystem://", CELERY_BROKER_TRANSPORT_OPTIONS=options
    ):
        response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["down"] == ["broker"]


@pytest.mark.django_db(transaction=True)
def test_readyz_when_the_database_is_down() -> None:
    connection.close()
    saved = dict(connection.settings_dict)
    connection.settings_dict.update({"HOST": "127.0.0.1", "PORT": str(free_port())})
    try:
        response = Client().get("/readyz")
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
    assert response.status_code == 503
    assert response.json()["down"] == ["database"]
