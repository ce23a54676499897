"""The ``tau`` command line as a researcher uses it: a subprocess against a live portal
(gunicorn, a Celery worker and the local agent on PostgreSQL/Redis), from ``tau login`` to
runs that succeed, fail, are cancelled and resumed."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from identity import tokens
from tests.executors.local.agent_harness import Agent, local_quota
from tests.runs.processes import ROOT, Portal, portal_processes

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

TAU = Path(sys.executable).parent / "tau"
EXAMPLE = ROOT / "examples" / "cpu-quickstart"


class Tau:
    """Runs ``tau`` with a home and config folder of its own (no TAU_* from outside)."""

    def __init__(self, home: Path) -> None:
        self.env = {
            "PATH": os.environ.get("PATH", ""),
            "LANG": "C.UTF-8",
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / "config"),
            "NO_PROXY": "127.0.0.1,localhost",
        }
        self.config = home / "config" / "taugrid" / "config.json"

    def __call__(
        self, *args: str, input: str | None = None, cwd: Path | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(TAU), *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            cwd=cwd or ROOT,
            timeout=timeout,
        )

    def json(self, *args: str) -> Any:
        done = self(*args, "--json")
        assert done.returncode == 0, done.stderr + done.stdout
        return json.loads(done.stdout)


def _sigint_as_at_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def portal(tmp_path: Path, settings: Any) -> Iterator[Portal]:
    yield from portal_processes(tmp_path, settings.CELERY_BROKER_URL)


def _said(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"


def _bundle_names(portal: Portal, token: str, run: dict[str, Any]) -> list[str]:
    request = urllib.request.Request(
        f"{portal.url}/api/v1/workspaces/alpha/runs/{run['name']}/bundle/",
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return sorted(zipfile.ZipFile(io.BytesIO(response.read())).namelist())


def _wait_for_state(tau: Tau, name: str, wanted: set[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = str(tau.json("run", "status", name)["state"])
        if state in wanted:
            return state
        time.sleep(0.3)
    raise AssertionError(f"{name} stayed {state}, not {wanted}")


def _pull_when_sealed(
    tau: Tau, name: str, cwd: Path, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``tau evidence pull`` once the record is sealed (until then: exit 1, "yet")."""
    deadline = time.monotonic() + timeout
    while True:
        done = tau("evidence", "pull", name, *args, cwd=cwd)
        if done.returncode != 1 or "yet" not in done.stderr or time.monotonic() > deadline:
            return done
        time.sleep(0.5)


def test_tau_from_login_to_resume(world: Any, portal: Portal, tmp_path: Path) -> None:
    local_quota(world.alpha)
    # The runs report their metrics through the SDK to this portal (TAU_API_URL).
    agent = Agent(tmp_path / "var", {"TAU_API_URL": portal.url}).start()
    tau = Tau(tmp_path / "home")
    try:
        portal.start()
        token = tokens.issue_token(user=world.users["researcher"], name="cli").plaintext

        # A wrong token is refused by the portal (exit 3) and nothing is saved.
        refused = tau("login", "--url", portal.url, "--token-stdin", input="tau_wrong\n")
        assert refused.returncode == 3, _said(refused)
        assert "tau login" in refused.stderr
        assert not tau.config.exists()

        logged_in = tau("login", "--url", portal.url, "--token-stdin", input=token + "\n")
        assert logged_in.returncode == 0, _said(logged_in)
        assert stat.S_IMODE(tau.config.stat().st_mode) == 0o600
        assert stat.S_IMODE(tau.config.parent.stat().st_mode) == 0o700
        me = tau.json("whoami")
        assert me["user"]["username"] == world.users["researcher"].username
        assert me["user"]["token"]["name"] == "cli"
        assert me["default_workspace"] == "alpha"
        assert [row["slug"] for row in me["workspaces"]] == ["alpha"]
        assert [row["slug"] for row in tau.json("workspace", "list")] == ["alpha"]
        assert tau.json("workspace", "show")["slug"] == "alpha"
        assert isinstance(tau.json("workspace", "quota"), list)

        # TAU_TOKEN overrides the saved token: a wrong one is exit 3 on any command.
        tau.env["TAU_TOKEN"] = "tau_wrong"
        assert tau("run", "list").returncode == 3
        del tau.env["TAU_TOKEN"]

        # init writes a project that validates; a broken file is exit 2 with line:column.
        project = tmp_path / "fresh"
        assert tau("init", str(project), "--template", "cpu").returncode == 0
        assert {".tauignore", "tau.yaml", "train.py"} <= {p.name for p in project.iterdir()}
        assert tau("run", "validate", str(project / "tau.yaml")).returncode == 0
        broken = tmp_path / "broken.yaml"
        broken.write_text("schema_version: 1\nname: b\nrun:\n  entrypoint: a.py\n  wokers: 2\n")
        invalid = tau("run", "validate", str(broken))
        assert invalid.returncode == 2
        assert f"{broken}:5:3: run.wokers" in invalid.stdout
        not_submitted = tau("run", "--config", str(broken))
        assert not_submitted.returncode == 2, _said(not_submitted)
        assert "5:3" in not_submitted.stderr

        # A slow copy of the example, with things .tauignore and .gitignore leave out.
        slow = tmp_path / "slow"
        shutil.copytree(EXAMPLE, slow, ignore=shutil.ignore_patterns("__pycache__"))
        (slow / "data").mkdir()
        (slow / "data" / "big.bin").write_bytes(b"x" * 1000)
        (slow / "notes.log").write_text("left out by .gitignore\n")
        (slow / "keep.log").write_text("taken back by .tauignore\n")
        (slow / "secret.txt").write_text("left out by .tauignore\n")
        (slow / ".gitignore").write_text("*.log\n")
        (slow / ".tauignore").write_text("data/\nsecret.txt\n!keep.log\n")
        slow_run = tau.json(
            "run",
            "--config",
            str(slow / "tau.yaml"),
            "--set",
            "name=cli-slow",
            "--set",
            "run.args=[--steps, 1000000, --log-every, 1]",
        )
        assert slow_run["state"] in {"pending", "queued", "admitted", "running"}
        assert _bundle_names(portal, token, slow_run) == [
            ".gitignore",
            ".tauignore",
            "keep.log",
            "tau.yaml",
            "train.py",
        ]
        # logs -f follows the log and ends when the run does (cancelled: exit 1).
        follower = subprocess.Popen(
            [str(TAU), "run", "logs", "cli-slow", "-f"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=tau.env,
        )
        try:
            _wait_for_state(tau, "cli-slow", {"running"})
            # Ctrl-C stops watching (exit 130), never the run.
            watcher = subprocess.Popen(
                [str(TAU), "run", "status", "cli-slow", "--watch"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=tau.env,
                # As at a terminal: a suite started in the background (`make test &`) runs
                # with SIGINT ignored, which children inherit, and Python then installs no
                # KeyboardInterrupt handler at all.
                preexec_fn=_sigint_as_at_a_terminal,
            )
            # Once it has shown the run's state (its first line, on stderr): a fixed two
            # seconds were once too few on a loaded machine, and ^C came before it knew the run.
            assert watcher.stderr is not None
            shown = watcher.stderr.readline()
            assert shown, "the watcher ended without a word"
            watcher.send_signal(signal.SIGINT)
            _watched_out, watched_err = watcher.communicate(timeout=30)
            assert watcher.returncode == 130, watched_err
            # The run's own name, not the spec name it was asked for by.
            assert re.search(r"cli-slow-[a-z0-9]+ goes on", watched_err), watched_err
            assert tau.json("run", "status", "cli-slow")["state"] == "running"
            # A live run has no evidence yet: said, exit 1, nothing written.
            early = tau("evidence", "pull", "cli-slow", cwd=tmp_path)
            assert early.returncode == 1, _said(early)
            assert "no evidence of cli-slow to download yet" in early.stderr
            assert not list(tmp_path.glob("*.evidence.tar*"))
            assert follower.poll() is None, "logs -f ended while the run was running"
            cancelled = tau.json("run", "cancel", "cli-slow")
            assert cancelled["state"] in {"cancelling", "cancelled"}
            followed_out, followed_err = follower.communicate(timeout=60)
        finally:
            if follower.poll() is None:
                follower.kill()
        assert follower.returncode == 1, followed_out[-2000:] + followed_err
        assert "step 3:" in followed_out
        assert tau("run", "status", "cli-slow", "--watch").returncode == 1

        # The example as it stands, followed to the end: exit 0, its log on stdout.
        watched = tau("run", "--config", str(EXAMPLE / "tau.yaml"), "--watch", timeout=240)
        assert watched.returncode == 0, _said(watched) + agent.output()
        assert "done: step 1500" in watched.stdout
        assert "succeeded" in watched.stderr
        # Named by its spec name: the newest run of it.
        status = tau.json("run", "status", "cpu-quickstart")
        assert status["state"] == "succeeded"
        assert tau("status", "cpu-quickstart").returncode == 0
        history = tau.json("run", "history", "cpu-quickstart")
        assert [e["new_state"] for e in history if e["new_state"]][-1] == "succeeded"
        metrics = tau.json("run", "metrics", "cpu-quickstart", "--key", "loss")
        assert len(metrics["series"]["loss"]) >= 50
        table = tau("run", "metrics", "cpu-quickstart")
        assert table.returncode == 0
        assert "loss" in table.stdout
        logs = tau("logs", "cpu-quickstart")
        assert logs.returncode == 0
        assert "done: step 1500" in logs.stdout
        assert tau("run", "status", "no-such-run").returncode == 4

        # Its evidence, pulled under the portal's file name and checked against the
        # portal's keyring (sealed by the worker a moment after the run ended).
        pulls = tmp_path / "pulls"
        pulls.mkdir()
        pulled = _pull_when_sealed(tau, "cpu-quickstart", pulls, "--verify")
        assert pulled.returncode == 0, _said(pulled)
        (record,) = pulls.iterdir()
        # <run>-attempt-<the attempt that ended>.evidence.tar
        assert record.name == f"{status['name']}-attempt-1.evidence.tar", record.name
        assert "a trusted key" in pulled.stdout
        again = tau("evidence", "pull", "cpu-quickstart", cwd=pulls)
        assert again.returncode == 2, _said(again)
        assert "--force" in again.stderr
        copy = tmp_path / "copy.tar"
        as_json = tau.json("evidence", "pull", "cpu-quickstart", "-o", str(copy))
        assert as_json == {"file": str(copy), "size": record.stat().st_size}
        assert copy.read_bytes() == record.read_bytes()  # deterministic export
        assert tau("evidence", "verify", str(copy)).returncode == 0
        assert tau("evidence", "pull", "no-such-run", cwd=pulls).returncode == 4

        # A workload that fails on its first attempt: exit 1; resumed, it succeeds.
        failing = tau(
            "run",
            "--config",
            str(EXAMPLE / "tau.yaml"),
            "--set",
            "name=cli-failing",
            "--set",
            "run.args=[--steps, 200, --fail-at-step, 20]",
            "--watch",
            "--json",
            timeout=180,
        )
        assert failing.returncode == 1, _said(failing)
        assert json.loads(failing.stdout.splitlines()[-1])["state"] == "failed"
        resumed = tau("run", "resume", "cli-failing", "--watch", timeout=180)
        assert resumed.returncode == 0, _said(resumed)
        assert "done: step 200" in resumed.stdout
        assert tau.json("run", "status", "cli-failing")["attempt_count"] == 2

        listed = tau.json("run", "list")
        assert {row["spec_name"] for row in listed} == {"cli-slow", "cpu-quickstart", "cli-failing"}
        mine = tau.json("run", "list", "--mine")
        assert {row["spec_name"] for row in mine} == {row["spec_name"] for row in listed}
        failed_only = tau.json("run", "list", "--state", "cancelled")
        assert [row["spec_name"] for row in failed_only] == ["cli-slow"]
        assert tau.json("queue") == []

        assert tau("logout").returncode == 0
        assert tau("run", "list").returncode == 3
    finally:
        agent.stop()
