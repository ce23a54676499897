"""Words for people: every state, every event kind and every retry reason has words that are
not the code; failure hints fit what happened; a finished cancel says who cancelled, not that
it is still stopping."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from runs import attempts, lifecycle, wording
from runs.events import verify_event_chain
from runs.models import (
    FAILURE_HINTS,
    WORKLOAD_EVENT_PREFIX,
    EventKind,
    FailureClass,
    RunAttempt,
    RunEvent,
    RunState,
)
from runs.state import transition
from runs.templatetags.run_words import event_words, retry_reason_words
from tests.runs.factories import make_run

RUNS = Path(__file__).resolve().parents[2] / "runs"


def _written_by_code() -> tuple[set[str], set[str], set[str]]:
    """What the code under runs/ hands to the event chain and as retry reasons: the event
    kinds named in ``append_event(run, <kind>)`` and ``transition(..., kind=<kind>)`` (which
    must be ``EventKind`` members, never free strings), the prefixes of kinds built from text
    (``append_workload_event``'s ``workload.``), and the retry reasons written as literals."""
    kinds: set[str] = set()
    prefixes: set[str] = {WORKLOAD_EVENT_PREFIX}
    reasons: set[str] = set()

    def kind_of(node: ast.AST, where: str) -> None:
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "EventKind":
            kinds.add(EventKind[node.attr].value)
        elif isinstance(node, ast.Name) and node.id == "kind":
            pass  # a function handing on its own ``kind``: its callers' kinds are seen
        else:
            raise AssertionError(
                f"{where}: an event kind must be an EventKind member, not {ast.unparse(node)}"
            )

    def literal(node: ast.AST, into: set[str]) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            into.add(node.value)
        elif isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "wording":
            into.add(getattr(wording, node.attr))
        elif isinstance(node, ast.Name) and node.id.isupper():
            into.add(getattr(wording, node.id))
        # Anything else is a copy of a field (``run.retry_reason``, ``failure.value``).

    for path in RUNS.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                keywords = {k.arg: k.value for k in node.keywords}
                where = f"{path.relative_to(RUNS.parent)}:{node.lineno}"
                if name == "append_event" and len(node.args) >= 2:
                    kind_of(node.args[1], where)
                if name in {"append_event", "transition"} and "kind" in keywords:
                    kind_of(keywords["kind"], where)
                if "retry_reason" in keywords:
                    literal(keywords["retry_reason"], reasons)
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if getattr(target, "attr", None) == "retry_reason":
                        literal(node.value, reasons)
    return kinds, prefixes, reasons


KINDS, PREFIXES, REASONS = _written_by_code()


def test_the_scan_finds_what_the_code_writes() -> None:
    # The scanner must see the code it guards: these are written by the run services.
    assert {
        EventKind.SUBMITTED,
        EventKind.CANCELLED,
        EventKind.CANCEL_REQUESTED,
        EventKind.RESUMED,
        EventKind.RETRY,
        EventKind.METRICS_SKIPPED,
        EventKind.DELIVERY_FAILED,
    } <= KINDS
    assert wording.MANUAL_RESUME in REASONS


def test_every_event_kind_the_code_writes_is_an_event_kind() -> None:
    assert set(EventKind) >= KINDS


def assert_for_people(phrase: str, code: str) -> None:
    assert phrase, f"no words for {code!r}"
    assert "_" not in phrase, f"{code!r} reads {phrase!r}"
    assert phrase != code, f"{code!r} is shown as itself"
    assert phrase.strip() == phrase


@pytest.mark.parametrize("state", list(RunState), ids=str)
def test_every_state_has_words(state: RunState) -> None:
    assert_for_people(wording.state_words(state), state.value)
    assert state.value in wording.STATE_WORDS


@pytest.mark.parametrize(
    "kind", sorted({kind.value for kind in EventKind} | {p + "eval_done" for p in PREFIXES})
)
@pytest.mark.parametrize("new_state", ["", *RunState], ids=lambda s: s or "no-state")
def test_every_event_kind_has_words(kind: str, new_state: str) -> None:
    if not any(kind.startswith(prefix) for prefix in PREFIXES):
        assert kind in wording.EVENT_WORDS, f"event kind {kind!r} has no words"
    words = wording.event_words(kind, new_state)
    shown = " ".join(part for part in (words.headline, words.state) if part)
    assert_for_people(shown, kind)
    for code in {kind, new_state} - {""}:
        assert code not in shown.split(), f"{code!r} leaks into {shown!r}"
    # Never the same thing twice ("cancelled → cancelled").
    assert words.headline.lower() != words.state.lower()
    if new_state:
        assert words.state in {"", wording.state_words(new_state)}


def test_a_plain_change_of_state_reads_as_the_state() -> None:
    assert wording.event_words("state", RunState.RUNNING) == wording.EventWords("", "Running")
    assert wording.event_words("cancelled", RunState.CANCELLED).state == ""
    assert wording.event_words("retry", RunState.QUEUED).state == "Queued"


REASONS_POSSIBLE = sorted(REASONS | {failure.value for failure in FailureClass})


@pytest.mark.parametrize("reason", REASONS_POSSIBLE)
def test_every_retry_reason_has_words(reason: str) -> None:
    # Retries record the failure class as their reason (finish_attempt), resumes a literal.
    assert reason in wording.RETRY_REASON_WORDS, f"retry reason {reason!r} has no words"
    assert_for_people(wording.retry_reason_words(reason), reason)


def test_no_reason_means_no_words() -> None:
    assert wording.retry_reason_words("") == ""
    assert retry_reason_words(RunAttempt(retry_reason="manual_resume").retry_reason) == (
        "resumed on request"
    )


# --- Failure hints ---------------------------------------------------------------------------

SAYS_THE_LOG_HAS_IT = ("log usually says", "log shows", "log may say", "log says")


def hint(failure: str, *, log_size: int, exit_code: int | None = 1, message: str = "") -> str:
    attempt = RunAttempt(
        failure_class=failure, log_size=log_size, exit_code=exit_code, failure_message=message
    )
    return attempt.failure_hint


def test_every_failure_class_has_both_hints() -> None:
    assert set(FAILURE_HINTS) == set(FailureClass)


@pytest.mark.parametrize("failure", list(FailureClass), ids=str)
@pytest.mark.parametrize("log_size", [0, 4096], ids=["empty-log", "some-log"])
def test_the_hint_fits_the_log(failure: FailureClass, log_size: int) -> None:
    text = hint(failure, log_size=log_size)
    other = hint(failure, log_size=4096 if log_size == 0 else 0)
    assert text
    assert text != other
    assert "{" not in text
    assert "}" not in text
    said_nothing_written = "anything" in text or "nothing reached" in text
    if log_size == 0:
        assert not any(phrase in text for phrase in SAYS_THE_LOG_HAS_IT), text
        assert said_nothing_written, text
    else:
        assert not said_nothing_written, text
        if failure in THE_PROGRAMS_OWN_STORY:
            assert "log" in text, text  # where the program's output tells what happened


# Failures whose story the program's output tells (the others happened to it from outside).
THE_PROGRAMS_OWN_STORY = {
    FailureClass.USER_ERROR,
    FailureClass.OOM_KILLED,
    FailureClass.NODE_FAILURE,
    FailureClass.DEADLINE_EXCEEDED,
    FailureClass.INFRASTRUCTURE,
    FailureClass.UNKNOWN,
}


def test_an_empty_log_with_an_exit_code_says_so() -> None:
    assert hint(FailureClass.USER_ERROR, log_size=0, exit_code=1) == (
        "It exited with code 1 before writing anything to its log; run the entrypoint on "
        "your machine to see why."
    )
    assert hint(FailureClass.USER_ERROR, log_size=10, exit_code=2) == (
        "It exited with code 2; the end of its log usually says why."
    )
    assert hint(FailureClass.USER_ERROR, log_size=10, exit_code=143).startswith(
        "It was stopped by SIGTERM (exit code 143);"
    )
    assert hint(FailureClass.USER_ERROR, log_size=0, exit_code=None).startswith(
        "It stopped with an error before writing anything"
    )


@pytest.mark.parametrize("failure", [FailureClass.INFRASTRUCTURE, FailureClass.UNKNOWN])
def test_an_empty_log_points_at_the_message_when_there_is_one(failure: FailureClass) -> None:
    with_message = hint(failure, log_size=0, message="could not create the environment")
    assert with_message.endswith("the message with it says what failed.")
    assert hint(failure, log_size=0).endswith("TauGrid's own logs.")


def test_no_failure_no_hint() -> None:
    assert RunAttempt(failure_class="").failure_hint == ""


# --- The reason of a cancelled run -----------------------------------------------------------


@pytest.mark.django_db
def test_a_finished_cancel_says_who_cancelled_it(world: Any) -> None:
    run = transition(make_run(world), RunState.QUEUED)
    attempt = attempts.admit_attempt(run=run)
    attempts.attempt_running(attempt=attempt)
    run = lifecycle.cancel_run(run=run, user=world.users["workspace_admin"])
    assert run.state == RunState.CANCELLING
    assert run.state_reason == "Cancel requested by alice; stopping its processes."
    run = attempts.finish_attempt(
        attempt=attempt, outcome=attempts.AttemptOutcome(succeeded=False, cancelled=True)
    )
    assert run.state == RunState.CANCELLED
    assert run.state_reason == "Cancelled by alice."
    last = RunEvent.objects.for_workspace(world.alpha).filter(run=run).order_by("-seq").first()
    assert last is not None
    assert last.message == "Cancelled by alice."
    assert event_words(last) == wording.EventWords(headline="Cancelled", state="")
    assert verify_event_chain(run)


@pytest.mark.django_db
def test_a_process_ending_while_it_is_cancelled_still_reads_as_cancelled(world: Any) -> None:
    run = transition(make_run(world), RunState.QUEUED)
    attempt = attempts.admit_attempt(run=run)
    attempts.attempt_running(attempt=attempt)
    lifecycle.cancel_run(run=run, user=world.users["researcher"])
    run = attempts.finish_attempt(
        attempt=attempt,
        outcome=attempts.AttemptOutcome(succeeded=False, exit_code=143, failure_class="user_error"),
    )
    assert run.state == RunState.CANCELLED
    assert run.state_reason == "Cancelled by rob."


@pytest.mark.django_db
def test_a_cancel_before_anything_runs_says_who(world: Any) -> None:
    run = make_run(world)
    run = lifecycle.cancel_run(run=run, user=world.users["researcher"])
    assert run.state == RunState.CANCELLED
    assert run.state_reason == "Cancelled by rob."
