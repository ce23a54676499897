"""``tau run status`` and ``tau run history`` of a Kubernetes run whose attempts failed: the
message the watcher recorded for each failed attempt is printed (the API had it; the CLI
printed only the class and the retry's "failed (could not start); retrying"). The real ``tau``
in a subprocess against the live portal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from identity import tokens
from runs import state
from runs.models import Backend, Run, RunState
from tests.cli.test_cli_end_to_end import Tau, _said
from tests.pages.test_browser_run_failures import GONE, NEVER_HEARD, SPEC, fail
from tests.runs.factories import make_run

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_status_and_history_say_what_failed(
    world: Any, live_server: Any, settings: Any, tmp_path: Path
) -> None:
    run = make_run(world, spec=SPEC, files={"train.py": "print('hi')\n"})
    settings.TAU_BACKEND = "kubernetes"
    run = state.transition(run, RunState.QUEUED)
    Run.objects.unscoped().filter(pk=run.pk).update(backend=Backend.KUBERNETES)
    run = fail(run, tmp_path, "infrastructure", GONE)
    assert run.state == RunState.QUEUED  # retried: attempt 2 waits

    tau = Tau(tmp_path / "home")
    token = tokens.issue_token(user=world.users["researcher"], name="cli").plaintext
    logged_in = tau("login", "--url", live_server.url, "--token-stdin", input=token + "\n")
    assert logged_in.returncode == 0, _said(logged_in)

    # While it waits for its retry, the reason names only the class: the message is below.
    status = tau("run", "status", run.name)
    assert status.returncode == 0, _said(status)
    assert "retrying" in status.stdout
    assert f"attempt 1:      infrastructure: {GONE}" in status.stdout

    run = fail(run, tmp_path, "unknown", NEVER_HEARD)
    assert run.state == RunState.FAILED
    status = tau("run", "status", run.name)
    assert f"attempt 1:      infrastructure: {GONE}" in status.stdout
    assert f"attempt 2:      unknown: {NEVER_HEARD}" in status.stdout

    history = tau("run", "history", run.name)
    assert history.returncode == 0, _said(history)
    lines = history.stdout.splitlines()
    retried = next(i for i, line in enumerate(lines) if "Attempt 1 failed (could not" in line)
    assert lines[retried + 1].strip() == f"attempt 1: {GONE}"
    # The final event already carries attempt 2's message: it is not printed twice.
    assert history.stdout.count(NEVER_HEARD) == 1
