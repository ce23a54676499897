"""The run lock (``runs.state.lock_run``) holds the run's row and nothing else: other work in
the same workspace goes on while a run is being changed (PostgreSQL's row locks; SQLite, the
embedded default, has one writer at a time anyway)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction

from identity.tokens import issue_token
from runs.state import lock_run
from tests.runs.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_locked_run_holds_up_nothing_that_points_at_its_workspace(world: Any) -> None:
    if connection.vendor != "postgresql":
        pytest.fail("this test is about PostgreSQL's row locks: run it on PostgreSQL")
    run = make_run(world)
    other = make_run(world)
    outcome: dict[str, Any] = {}

    def meanwhile() -> None:
        # Another process's work while the run is locked, each part failing rather than
        # waiting: a token of the workspace (a row whose foreign key PostgreSQL checks with a
        # share lock on the workspace at commit), and another run of it changed.
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '2s'")
                issue_token(
                    user=world.users["researcher"], name="meanwhile", workspace=run.workspace
                )
                lock_run(other.pk)
            outcome["done"] = True
        except Exception as error:  # what the main thread reports
            outcome["error"] = error
        finally:
            connections.close_all()

    with transaction.atomic():
        locked = lock_run(run.pk)
        assert locked.workspace == run.workspace  # read along with the run
        worker = threading.Thread(target=meanwhile)
        worker.start()
        worker.join(timeout=30)
    assert outcome == {"done": True}, outcome
