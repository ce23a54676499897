"""A Kubernetes run's failures on its page, in a real browser: every failed attempt shows the
message the watcher recorded for it (the hint says "the message with it says what failed", so
the message must be there), the newest one whole in the box above, and the artifacts card says
what keeps a file on Kubernetes (nothing collects a pod's files) rather than the local
executor's "kept when an attempt ends on this machine"; checked with axe-core at both widths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runs import attempts, state
from runs.models import Backend, Run, RunState
from tests.pages.browser_support import check_page, log_in, watch_console
from tests.runs.factories import make_run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SPEC = b"""schema_version: 1
name: kube-failing
run:
  entrypoint: train.py
  workload_kind: rayjob
compute:
  cpus: 1
  memory: 1Gi
outputs:
  artifacts: ["*.pt"]
resilience:
  max_retries: 1
  retry_on: [infrastructure]
"""
#: What executors.kubernetes.status says about a Job deleted behind TauGrid's back (infrastructure).
GONE = (
    "Its Job or RayJob is gone, deleted outside TauGrid (by hand or by a controller) while it ran."
)
#: And about a RayJob whose dashboard never said how the job ended (unknown), longer than the
#: 400 characters the box used to cut it at.
NEVER_HEARD = (
    "KubeRay could not learn how the Ray job ended: its submitter finished, but the Ray "
    "dashboard (kube-failing-x-head-svc.tau-demo.svc.cluster.local:8265) never reported a "
    "final status, so whether the program succeeded is unknown (not retried: it may have "
    "finished; the platform team can check that the KubeRay operator reaches the Ray head's "
    "dashboard). KubeRay says: The RayJob submitter finished at 2026-12-01 02:34:39 but the "
    "ray job did not reach terminal state within 30s; the end of this sentence is past 400."
)


def fail(run: Run, tmp_path: Path, failure_class: str, message: str) -> Run:
    """One attempt through the services as the watcher drives them, its (empty) log kept as
    the watcher keeps a cluster's logs, ending with ``message``."""
    attempt = attempts.admit_attempt(run=Run.objects.unscoped().get(pk=run.pk))
    attempts.attempt_running(attempt=attempt)
    kept = tmp_path / f"attempt-{attempt.number}.log"
    kept.write_text("")
    attempts.note_log_kept(attempt_id=attempt.pk, path=str(kept), size=0)
    attempt.refresh_from_db()
    return attempts.finish_attempt(
        attempt=attempt,
        outcome=attempts.AttemptOutcome(
            succeeded=False, failure_class=failure_class, message=message
        ),
    )


def test_each_failed_attempt_shows_its_message(
    world: Any, live_server: Any, page: Any, settings: Any, tmp_path: Path
) -> None:
    run = make_run(world, spec=SPEC, files={"train.py": "print('hi')\n"})
    settings.TAU_BACKEND = "kubernetes"
    run = state.transition(run, RunState.QUEUED)
    Run.objects.unscoped().filter(pk=run.pk).update(backend=Backend.KUBERNETES)
    run = fail(run, tmp_path, "infrastructure", GONE)
    assert run.state == RunState.QUEUED  # retried
    run = fail(run, tmp_path, "unknown", NEVER_HEARD)
    assert run.state == RunState.FAILED

    problems = watch_console(page)
    log_in(page.context, live_server.url, world.users["researcher"])
    page.goto(f"{live_server.url}/w/alpha/runs/{run.name}/")

    box = page.inner_text(".error-box")
    assert "Attempt 2: Unknown." in box
    assert "the message with it says what failed" in box
    assert NEVER_HEARD in box  # whole, not cut at 400 characters
    listed = [item.inner_text() for item in page.query_selector_all(".attempts > li")]
    assert len(listed) == 2
    newest, first = listed
    assert "Could not start." in first
    assert "the message with it says what failed" in first
    assert GONE in first  # the message the hint points to is there
    assert NEVER_HEARD not in newest  # shown once, in the box

    artifacts = page.inner_text("#artifacts-heading + *")
    assert "kept when an attempt ends on this machine" not in artifacts
    assert "On Kubernetes a file is kept only when the workload uploads it" in artifacts
    check_page(page, "run-kube-failures")
    assert problems == []
