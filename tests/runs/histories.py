"""Runs with a past, made through the services as real ones are: attempts that failed and
were retried, a resume, a cancel; each attempt with a log file on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runs import attempts, lifecycle, state
from runs.models import Run, RunAttempt, RunState
from tests.runs.factories import make_run

RETRYING = b"""schema_version: 1
name: storied
run:
  entrypoint: main.py
  workload_kind: job
compute:
  cpus: 1
  memory: 256Mi
resilience:
  max_retries: 1
  retry_on: [user_error]
"""


def storied_run(world: Any, directory: Path) -> Run:
    """A run with a past: a failure retried, a failure that ends it, a resume, a cancel that
    finished; every attempt with a log on disk (the first one empty)."""
    run = state.transition(make_run(world, spec=RETRYING), RunState.QUEUED)
    for outcome, text in [
        (attempts.AttemptOutcome(succeeded=False, exit_code=1, failure_class="user_error"), ""),
        (
            attempts.AttemptOutcome(succeeded=False, exit_code=2, failure_class="user_error"),
            "second attempt\nTraceback: boom\n",
        ),
    ]:
        attempt = attempts.admit_attempt(run=run)
        write_log(attempt, directory, text)
        attempts.attempt_running(attempt=attempt)
        run = attempts.finish_attempt(attempt=attempt, outcome=outcome)
    assert run.state == RunState.FAILED
    run = lifecycle.resume_run(run=run, user=world.users["researcher"])
    attempt = attempts.admit_attempt(run=run)
    write_log(attempt, directory, "third attempt, resumed\n")
    attempts.attempt_running(attempt=attempt)
    lifecycle.cancel_run(run=run, user=world.users["researcher"])
    run = attempts.finish_attempt(
        attempt=attempt, outcome=attempts.AttemptOutcome(succeeded=False, cancelled=True)
    )
    assert run.state == RunState.CANCELLED
    return run


def write_log(attempt: RunAttempt, directory: Path, text: str) -> None:
    path = directory / f"attempt-{attempt.number}.log"
    path.write_text(text)
    # On the attempt itself too: finish_attempt saves the object it is given.
    attempt.log_path = str(path)
    attempt.log_size = len(text.encode())
    attempt.save(update_fields=["log_path", "log_size"])
