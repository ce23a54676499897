"""The fault-injection experiment of issue 11 (benchmarks/fault_injection.py), small: 20
submissions over HTTP to gunicorn, Celery on a Redis of its own, the real agent, which is
killed with SIGKILL right after a workload has exited, and a Celery worker killed once.
Nothing may be lost or duplicated, and no finished attempt may run again."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.fault_injection import experiment, journal_rerun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]


def test_kill_9_of_the_agent_right_after_exits_loses_and_repeats_nothing(tmp_path: Path) -> None:
    results = experiment(
        var_dir=tmp_path / "var",
        submissions=20,
        agent_kills=1,
        worker_kills=1,
        redis_stop_seconds=0,
        pace=0.15,
        finish_timeout=120,
        say=lambda line: None,
    )
    assert results["accepted"] == 20, results
    assert results["lost"] == 0, results
    assert results["duplicated"] == 0, results
    assert results["finished_attempts_run_again"] == 0, results
    assert results["broken_event_chains"] == 0, results
    assert results["runs_by_state"] == {"succeeded": 20}, results
    # The kill came right after a workload had exited: the next agent found at least that
    # attempt and closed it with its real result.
    assert results["attempts_closed_with_their_real_result_after_a_restart"] >= 1, results


def test_a_journal_with_a_start_after_an_end_is_a_rerun(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.write_text("start 1 1.0\nend 1 2.0\n")
    assert not journal_rerun(journal)
    journal.write_text("start 1 1.0\nstart 2 3.0\nend 2 4.0\n")  # cut short, then run
    assert not journal_rerun(journal)
    journal.write_text("start 1 1.0\nend 1 2.0\nstart 2 3.0\nend 2 4.0\n")
    assert journal_rerun(journal)
