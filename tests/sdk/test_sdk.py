"""The workload SDK (``tau.log_metrics``, ``tau.checkpoint_saved``, ``tau.resume_from``)
against the portal's real web process (gunicorn, PostgreSQL), with a run token as a run gets
it: rows and a checkpoint reach the run; with the portal stopped the training loop goes on,
the rows wait and arrive once it is back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tau
from runs.models import Checkpoint, MetricPoint
from tau import sdk
from tests.runs.factories import make_run
from tests.runs.processes import Portal, portal_processes
from tests.runs.test_api import run_token

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def portal(tmp_path: Path, settings: Any) -> Iterator[Portal]:
    yield from portal_processes(tmp_path, settings.CELERY_BROKER_URL)


@pytest.fixture
def in_a_run(world: Any, portal: Portal, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """This process as a run's workload: the environment every run gets."""
    run = make_run(world)
    for name, value in {
        "TAU_API_URL": portal.url,
        "TAU_RUN_TOKEN": run_token(world, run),
        "TAU_WORKSPACE": run.workspace.slug,
        "TAU_RUN_NAME": run.name,
        "TAU_RESUME_FROM": "step-100",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sdk, "SEND_INTERVAL_SECONDS", 0.2)
    monkeypatch.setattr(sdk, "FIRST_RETRY_SECONDS", 0.2)
    monkeypatch.setattr(sdk, "MAX_RETRY_SECONDS", 0.5)
    sdk._reset()
    yield run
    sdk._reset()


def points(run: Any) -> int:
    return MetricPoint.objects.unscoped().filter(run=run).count()


def test_rows_and_a_checkpoint_reach_the_run_and_wait_out_an_outage(
    in_a_run: Any, portal: Portal, capfd: pytest.CaptureFixture[str]
) -> None:
    run = in_a_run
    portal.start(worker=False, beat=False)
    assert tau.resume_from() == "step-100"

    started = time.monotonic()
    for step in range(1, 1501):
        tau.log_metrics(step, loss=1 / step, lr=0.01)
    assert time.monotonic() - started < 1.0  # appending only: nothing waits for the portal
    tau.log_metrics(1501, loss=float("nan"), note="x")  # type: ignore[arg-type]
    tau.checkpoint_saved("step-1500", 1500)
    assert tau.flush(timeout=60)
    assert points(run) == 3000  # 1,500 rows of two values, sent in batches
    (checkpoint,) = Checkpoint.objects.unscoped().filter(run=run)
    assert (checkpoint.step, checkpoint.path.endswith("step-1500")) == (1500, True)
    said = capfd.readouterr().err
    assert "loss=nan at step 1501 is not a finite number; skipped" in said

    # The portal goes away: training goes on, the rows wait, one warning says so.
    portal.stop()
    for step in range(1502, 1602):
        tau.log_metrics(step, loss=0.5)
    assert not tau.flush(timeout=2)
    assert points(run) == 3000
    said = capfd.readouterr().err
    assert said.count("the portal cannot be reached") == 1, said
    assert "Training goes on." in said

    # Back: what waited arrives.
    portal.start(worker=False, beat=False)
    assert tau.flush(timeout=60)
    assert points(run) == 3100
    assert "the portal answers again" in capfd.readouterr().err

    # The spelling of the tau.yaml contract (TAU_YAML.md): the same reports.
    from tau import track

    track.log(step=1602, loss=0.25)
    track.checkpoint("step-1602", 1602)
    assert tau.flush(timeout=60)
    assert points(run) == 3101
    assert MetricPoint.objects.unscoped().get(run=run, step=1602).value == 0.25
    assert Checkpoint.objects.unscoped().filter(run=run, step=1602).exists()


def test_outside_a_run_the_calls_do_nothing_and_say_so_once(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    for name in ("TAU_API_URL", "TAU_RUN_TOKEN", "TAU_RESUME_FROM"):
        monkeypatch.delenv(name, raising=False)
    sdk._reset()
    try:
        tau.log_metrics(1, loss=0.3)
        tau.log_metrics(2, loss=0.2)
        tau.checkpoint_saved("step-2", 2)
        assert tau.resume_from() is None
        assert tau.flush(timeout=1)
    finally:
        sdk._reset()
    assert capfd.readouterr().err.count("not inside a TauGrid run") == 1


def test_in_a_multi_worker_run_only_rank_0_reports_unless_told_otherwise(
    in_a_run: Any,
    portal: Portal,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Issue 32: worker 1 of 2 (the rendezvous variables, docs/distributed.md) reports no
    metric and no checkpoint, and says why once; rank 0 reports; a worker told to
    (``report_from_every_rank``) reports too."""
    portal.start(worker=False, beat=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    tau.log_metrics(1, loss=0.5)
    tau.log_metrics(2, loss=0.4)
    tau.checkpoint_saved("step-2", 2)
    assert tau.flush(timeout=60)
    assert points(in_a_run) == 0
    assert not Checkpoint.objects.unscoped().filter(run=in_a_run).exists()
    said = capfd.readouterr().err
    assert said.count("this is worker RANK 1: log_metrics is reported by rank 0 only") == 1
    assert said.count("reported by rank 0 only") == 1

    tau.report_from_every_rank()
    tau.log_metrics(3, rank1_loss=0.3)
    monkeypatch.setenv("RANK", "0")
    tau.report_from_every_rank(False)
    tau.log_metrics(3, loss=0.3)
    assert tau.flush(timeout=60)
    keys = dict(MetricPoint.objects.unscoped().filter(run=in_a_run).values_list("key", "step"))
    assert keys == {"rank1_loss": 3, "loss": 3}


def test_a_sweep_trial_s_rows_are_its_own(
    in_a_run: Any, portal: Portal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a sweep's trial (``TAU_TRIAL_ID``) every key is the trial's: trial-3/loss."""
    monkeypatch.setenv("TAU_TRIAL_ID", "3")
    monkeypatch.setenv("TAU_TRIAL_CONFIG", '{"lr": 0.01}')
    portal.start(worker=False, beat=False)
    assert tau.trial_config() == {"lr": 0.01}
    tau.log_metrics(7, loss=0.5, acc=0.75)
    assert tau.flush(timeout=60)
    keys = dict(MetricPoint.objects.unscoped().filter(run=in_a_run).values_list("key", "value"))
    assert keys == {"trial-3/loss": 0.5, "trial-3/acc": 0.75}


def test_a_step_the_portal_would_refuse_is_refused_here_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 30: steps above 2^53 - 1 cannot be held exactly by a run's evidence (nor by any
    JSON reader): the SDK says so at once instead of sending what the portal refuses."""
    monkeypatch.setenv("TAU_API_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("TAU_RUN_TOKEN", "tau_run_not-sent")
    monkeypatch.setenv("TAU_WORKSPACE", "alpha")
    monkeypatch.setenv("TAU_RUN_NAME", "train-1")
    sdk._reset()
    try:
        tau.log_metrics(2**53, loss=0.5)
        tau.log_metrics(-1, loss=0.5)
        tau.checkpoint_saved("step-1", 2**53)
        tau.checkpoint_saved("step-1", 1, size=2**60)
        reporter = sdk.reporter()
        assert (list(reporter.rows), list(reporter.checkpoints)) == ([], [])
    finally:
        sdk._reset()
    said = capfd.readouterr().err
    assert "log_metrics: step must be a whole number from 0 to 2^53 - 1" in said
    assert "not 9007199254740992; row skipped" in said
    assert "checkpoint_saved: size must be a whole number from 0 to 2^53 - 1" in said

    class NumpyInt:  # what numpy.int64 and torch integers offer: __index__
        def __index__(self) -> int:
            return 7

    assert sdk._whole_number(NumpyInt(), "step") == 7
    assert sdk._whole_number(2**53 - 1, "step") == 2**53 - 1
    assert isinstance(sdk._whole_number(True, "step"), str)
    assert isinstance(sdk._whole_number(1.5, "step"), str)
