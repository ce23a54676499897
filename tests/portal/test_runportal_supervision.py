"""``make run`` supervises its processes (issue 30): a process that stops is started again
with a pause that grows while it keeps stopping, and the console says so once, not once per
try. Real child processes under runportal's own supervisor, with short pauses so the test is
quick; tests/portal/test_make_run.py kills the real local agent under the real ``make run``.
"""

from __future__ import annotations

import io
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management.base import OutputWrapper

from web.management.commands import runportal

pytestmark = pytest.mark.services

FIRST, MOST, STABLE = 0.2, 0.8, 3.0


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runportal, "_FIRST_PAUSE_SECONDS", FIRST)
    monkeypatch.setattr(runportal, "_MAX_PAUSE_SECONDS", MOST)
    monkeypatch.setattr(runportal, "_STABLE_SECONDS", STABLE)


class Watched:
    """A supervisor of one child, its console as text, and when the child was started."""

    def __init__(self, tmp_path: Path, command: list[str], monkeypatch: Any) -> None:
        self.out = io.StringIO()
        self.console = runportal._Console(OutputWrapper(self.out))
        self.supervisor = runportal._Supervisor(
            {"agent": command}, {"agent": {"PATH": "/usr/bin:/bin"}}, self.console, tmp_path
        )
        self.starts: list[float] = []
        self.pauses: list[float] = []  # the pause the supervisor chose after each stop
        start = runportal._Supervisor._start
        stopped = runportal._Supervisor._stopped

        def counted(supervisor: Any, child: Any) -> None:
            self.starts.append(time.monotonic())
            start(supervisor, child)

        def paused(supervisor: Any, child: Any, process: Any, now: float) -> None:
            stopped(supervisor, child, process, now)
            self.pauses.append(round(child.restart_at - now, 3))

        monkeypatch.setattr(runportal._Supervisor, "_start", counted)
        monkeypatch.setattr(runportal._Supervisor, "_stopped", paused)

    def run(self, seconds: float) -> None:
        self.supervisor.start_all()
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                self.supervisor.tend()
                time.sleep(0.05)
        finally:
            self.supervisor.stop_all()
            self.console.finish()

    def lines(self) -> list[str]:
        return self.out.getvalue().splitlines()


def test_a_process_that_keeps_crashing_is_backed_off_and_said_once(
    tmp_path: Path, quick: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    crashing = [sys.executable, "-c", "import sys; print('agent: boom'); sys.exit(3)"]
    watched = Watched(tmp_path, crashing, monkeypatch)
    watched.run(seconds=8)
    lines = watched.lines()
    # Started again and again, never given up: only Ctrl-C (stop_all) ends it.
    assert len(watched.starts) >= 5, lines
    # At once the first time, then pauses that double up to the most.
    expected = [0.0, FIRST, 2 * FIRST, MOST] + [MOST] * (len(watched.pauses) - 4)
    assert watched.pauses == expected, watched.pauses
    # And they were kept: no start came sooner than its pause.
    gaps = [later - earlier for earlier, later in itertools.pairwise(watched.starts)]
    assert all(gap >= pause for gap, pause in zip(gaps, watched.pauses, strict=False)), gaps
    # Said once when it stopped, once more when it kept stopping, and then nothing.
    assert [line for line in lines if "stopped" in line] == [
        "The local agent stopped unexpectedly (exit code 3); starting it again.",
        "The local agent stopped again (exit code 3); starting it again with growing pauses "
        "(up to 1 s) until it stays up, its output meanwhile in "
        f"{tmp_path / 'logs' / 'agent.log'}. Ctrl-C stops everything.",
    ]
    # Its own output: on the console for the first two starts, then in the file.
    assert lines.count("agent: boom") == 2, lines
    kept = (tmp_path / "logs" / "agent.log").read_text().splitlines()
    # Every later start's line, except that the last start may be stopped (stop_all) before
    # its interpreter got as far as printing, on a loaded machine.
    assert len(watched.starts) - 3 <= kept.count("agent: boom") <= len(watched.starts) - 2


def test_a_process_that_stays_up_again_is_said_to_run_again(
    tmp_path: Path, quick: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two quick crashes, then it stays up: one line for each, and one that it runs again."""
    tries = tmp_path / "tries"
    script = (
        "import pathlib, sys, time\n"
        f"tries = pathlib.Path({str(tries)!r})\n"
        "tries.write_text(tries.read_text() + 'x' if tries.exists() else 'x')\n"
        "if len(tries.read_text()) <= 2: sys.exit(1)\n"
        "time.sleep(60)\n"
    )
    watched = Watched(tmp_path, [sys.executable, "-c", script], monkeypatch)
    watched.run(seconds=STABLE + 3)
    lines = watched.lines()
    assert len(watched.starts) == 3, lines
    assert sum("stopped" in line for line in lines) == 2, lines
    assert lines[-1] == "The local agent is running again.", lines


def test_a_process_killed_once_is_said_once(
    tmp_path: Path, quick: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 (as the issue's fault run did to the agent): one line, then it runs."""
    watched = Watched(tmp_path, [sys.executable, "-c", "import time; time.sleep(60)"], monkeypatch)
    watched.supervisor.start_all()
    try:
        process = watched.supervisor.children["agent"].process
        assert process is not None
        process.kill()
        process.wait()
        deadline = time.monotonic() + 5
        while len(watched.starts) < 2 and time.monotonic() < deadline:
            watched.supervisor.tend()
            time.sleep(0.05)
    finally:
        watched.supervisor.stop_all()
        watched.console.finish()
    assert len(watched.starts) == 2
    assert watched.lines() == [
        "The local agent stopped unexpectedly (signal SIGKILL); starting it again."
    ]
