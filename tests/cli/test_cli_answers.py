"""What ``tau`` says about the portal's answers, word for word: a refused submission, a log
that is not there, a run that ended while it was followed, a cancellation still under way.
The portal is played by an httpx MockTransport that answers as the API does (the same
answers against a live portal are in test_cli_end_to_end.py and test_cli_members.py); the
project folder limits are checked on real files."""

from __future__ import annotations

import builtins
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tau.cli import bundle, commands, common, main
from tau.cli.client import Api, problem_text
from tau.cli.templates import COMMENT_COLUMN, TEMPLATES, tau_yaml

RUN = "/api/v1/workspaces/alpha/runs/cpu-quickstart-x7k2m9qa/"
SPEC_NAMED = "/api/v1/workspaces/alpha/runs/cpu-quickstart/"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cpu-quickstart"

Answer = Callable[[httpx.Request], httpx.Response]


def run(state: str, reason: str = "", **extra: Any) -> dict[str, Any]:
    return {
        "name": "cpu-quickstart-x7k2m9qa",
        "spec_name": "cpu-quickstart",
        "state": state,
        "state_reason": reason,
        "attempt_count": 1,
        **extra,
    }


def _json_answer(body: Any) -> Answer:
    return lambda _request: httpx.Response(200, json=body)


class FakePortal:
    """Answers by (method, path), in turn; the last answer of a route repeats."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], list[Answer]] = {}
        self.requests: list[httpx.Request] = []

    def on(self, method: str, path: str, *answers: Any) -> None:
        """Answer with these in turn: functions of the request, or JSON bodies (200)."""
        self.routes[(method, path)] = [
            answer if callable(answer) else _json_answer(answer) for answer in answers
        ]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answers = self.routes.get((request.method, request.url.path))
        if not answers:
            return httpx.Response(404, json={"detail": "Not found."})
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        return answer(request)


@pytest.fixture
def portal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakePortal:
    fake = FakePortal()

    class FakeApi(Api):
        def __init__(self, url: str, token: str | None, **kwargs: Any) -> None:
            super().__init__(url, token, **kwargs)
            self.http = httpx.Client(base_url=self.url, transport=httpx.MockTransport(fake))

    monkeypatch.setattr(common, "Api", FakeApi)  # where the commands' client is made
    monkeypatch.setattr(commands, "POLL_SECONDS", 0.01)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("TAU_URL", "https://tau.example.org")
    monkeypatch.setenv("TAU_TOKEN", "tau_test")
    monkeypatch.setenv("TAU_WORKSPACE", "alpha")
    monkeypatch.delenv("TAU_PROFILE", raising=False)
    monkeypatch.delenv("TAU_CONFIG", raising=False)
    return fake


# --- submitting ---------------------------------------------------------------------------


PRIORITY_PROBLEM = {
    "path": "queue.priority",
    "line": 12,
    "column": 13,
    "message": "urgent is not a priority of workspace alpha",
    "hint": "one of: normal",
}


def refused_submission(request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        400, json={"detail": "The run was not submitted.", "problems": [PRIORITY_PROBLEM]}
    )


def test_a_refused_submission_says_so_once(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    portal.on("POST", "/api/v1/workspaces/alpha/runs/", refused_submission)
    config = str(EXAMPLE / "tau.yaml")
    assert main(["run", "--config", config]) == 2
    said = capsys.readouterr()
    assert said.err.splitlines() == [
        f"{config}:12:13: queue.priority: urgent is not a priority of workspace alpha "
        "(one of: normal)",
        "tau: The run was not submitted.",
    ]
    assert said.out == ""


def test_a_refused_submission_in_json_has_the_exit_code_and_details(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    portal.on("POST", "/api/v1/workspaces/alpha/runs/", refused_submission)
    config = str(EXAMPLE / "tau.yaml")
    assert main(["run", "--config", config, "--json"]) == 2
    answer = json.loads(capsys.readouterr().out)
    assert answer == {
        "error": "The run was not submitted.",
        "exit_code": 2,
        "details": {
            "detail": "The run was not submitted.",
            "problems": [{"file": config, **PRIORITY_PROBLEM}],
        },
    }


def test_an_invalid_spec_in_json_has_the_exit_code_and_details(
    portal: FakePortal, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "tau.yaml"
    bad.write_text("schema_version: 1\nname: x\nrun:\n  entrypoint: a.py\ncompute:\n  gpus: many\n")
    assert main(["run", "--config", str(bad), "--json"]) == 2
    said = capsys.readouterr()
    answer = json.loads(said.out)
    assert answer["error"] == f"{bad} is not valid (1 problem); nothing was sent."
    assert answer["exit_code"] == 2
    (problem,) = answer["details"]["problems"]
    assert (problem["file"], problem["path"], problem["line"]) == (str(bad), "compute.gpus", 6)
    assert f"{bad}:6:9: compute.gpus" in said.err
    assert portal.requests == []


# --- the project folder --------------------------------------------------------------------


def test_a_project_too_large_to_unpack_is_refused_while_walking(
    portal: FakePortal, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """600 MiB of one file (sparse: no disk used) is more than the portal unpacks: refused
    before anything is zipped (it zips to almost nothing, so the zip's size never said)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "tau.yaml").write_bytes((EXAMPLE / "tau.yaml").read_bytes())
    (project / "train.py").write_text("print('hi')\n")
    with (project / "weights.bin").open("wb") as file:
        file.truncate(600 * 2**20)
    assert main(["run", "--config", str(project / "tau.yaml")]) == 2
    said = capsys.readouterr().err
    assert "more than 500 MiB, the most the portal unpacks (largest: weights.bin 600.0 MiB" in said
    assert ".tauignore" in said
    assert portal.requests == []


def test_a_project_too_large_zipped_stops_zipping_at_the_limit(
    portal: FakePortal,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Three 30 MiB files that do not compress: the zip passes 50 MiB in the second one, and
    the third is never read."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "tau.yaml").write_bytes((EXAMPLE / "tau.yaml").read_bytes())
    noise = random.Random(30)
    for name in ("a.bin", "b.bin", "c.bin"):
        (project / name).write_bytes(noise.randbytes(30 * 2**20))
    opened: list[str] = []
    real_open = builtins.open

    def spying_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if str(file).startswith(str(project)):
            opened.append(Path(file).name)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spying_open)
    code = main(["run", "--config", str(project / "tau.yaml")])
    monkeypatch.undo()
    assert code == 2
    said = capsys.readouterr().err
    assert "more than 50 MiB zipped, the most the portal takes (stopped at b.bin;" in said
    assert "c.bin" not in opened
    assert portal.requests == []


def test_a_project_with_too_many_files_is_refused_while_walking(tmp_path: Path) -> None:
    for index in range(bundle.MAX_FILES + 1):
        (tmp_path / f"f{index}.txt").write_text("")
    with pytest.raises(bundle.BundleTooLarge, match="more than 5,000 files"):
        bundle.project_files(tmp_path, bundle.Ignore.for_project(tmp_path))


# --- following and stopping runs -----------------------------------------------------------


def test_status_watch_ends_with_the_run_name_not_the_spec_name(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    portal.on("GET", SPEC_NAMED, run("running"), run("succeeded", "Finished."))
    assert main(["status", "cpu-quickstart", "--watch"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == "cpu-quickstart-x7k2m9qa succeeded."


def test_cancelling_a_queued_run_says_how_it_ended(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API answers `cancelling` while the backend stops it (a queued Kubernetes job is
    deleted a moment later): tau waits for that moment."""
    portal.on("POST", RUN + "cancel/", run("cancelling", "Cancelling (asked by rob)."))
    portal.on("GET", RUN, run("cancelling"), run("cancelled", "Cancelled by rob."))
    assert main(["cancel", "cpu-quickstart-x7k2m9qa"]) == 0
    assert capsys.readouterr().out == "cpu-quickstart-x7k2m9qa: cancelled.\n"
    assert main(["cancel", "cpu-quickstart-x7k2m9qa", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "cancelled"


def test_a_cancellation_still_under_way_is_said_as_such(
    portal: FakePortal, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(commands, "CANCEL_WAIT_SECONDS", 0.05)
    portal.on("POST", RUN + "cancel/", run("cancelling"))
    portal.on("GET", RUN, run("cancelling"))
    assert main(["cancel", "cpu-quickstart-x7k2m9qa"]) == 0
    assert capsys.readouterr().out == (
        "cpu-quickstart-x7k2m9qa: cancelling; its backend is still stopping it "
        "(`tau run status cpu-quickstart-x7k2m9qa --watch` follows it to the end).\n"
    )


def empty_text_log(request: httpx.Request) -> httpx.Response:
    assert request.url.params.get("format") == "text"
    return httpx.Response(200, content=b"", headers={"Content-Type": "text/plain"})


def log_answers(*chunks: dict[str, Any]) -> Answer:
    """The logs route: the whole log as text (empty here), pieces of it as JSON."""
    pieces = list(chunks)

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("format") == "text":
            return empty_text_log(request)
        piece = pieces.pop(0) if len(pieces) > 1 else pieces[0]
        return httpx.Response(200, json=piece)

    return answer


def chunk(attempt: int | None, *, text: str = "", complete: bool = False, note: str = "") -> Any:
    size = len(text.encode())
    return {
        "attempt": attempt,
        "offset": 0,
        "next_offset": size,
        "size": size,
        "complete": complete,
        "text": text,
        "pod": "",
        "pods": [],
        "note": note,
    }


def test_logs_say_why_there_is_no_log(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    note = "the pod cannot be scheduled: 0/3 nodes have a free nvidia.com/gpu"
    portal.on("GET", RUN, run("admitted"))
    portal.on("GET", RUN + "logs/", log_answers(chunk(1, note=note)))
    assert main(["logs", "cpu-quickstart-x7k2m9qa"]) == 0
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err == f"attempt 1 of cpu-quickstart-x7k2m9qa has no log: {note}\n"


def test_logs_of_a_run_that_has_not_started(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    portal.on("GET", RUN, run("queued", "Waiting for quota: 8 GPUs are in use."))
    portal.on("GET", RUN + "logs/", log_answers(chunk(None)))
    assert main(["logs", "cpu-quickstart-x7k2m9qa"]) == 0
    assert capsys.readouterr().err == (
        "cpu-quickstart-x7k2m9qa has no log yet: it is queued (Waiting for quota: 8 GPUs are "
        "in use.); `tau run logs cpu-quickstart-x7k2m9qa -f` waits for it.\n"
    )


def test_logs_of_an_attempt_that_wrote_nothing(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    portal.on("GET", RUN, run("succeeded"))
    portal.on("GET", RUN + "logs/", log_answers(chunk(1, complete=True)))
    assert main(["logs", "cpu-quickstart-x7k2m9qa"]) == 0
    assert capsys.readouterr().err == (
        "attempt 1 of cpu-quickstart-x7k2m9qa wrote nothing to its log.\n"
    )


def test_following_a_run_cancelled_meanwhile_says_so(
    portal: FakePortal, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pod waits (the note is said once), then the run is cancelled: exit 1, with why."""
    note = "the pod is pulling its image"
    portal.on("GET", RUN, run("admitted"), run("admitted"), run("cancelled", "Cancelled by rob."))
    portal.on(
        "GET",
        RUN + "logs/",
        log_answers(chunk(1, note=note), chunk(1, note=note), chunk(1, complete=True)),
    )
    assert main(["logs", "cpu-quickstart-x7k2m9qa", "-f"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"cpu-quickstart-x7k2m9qa: no log yet: {note}",
        "cpu-quickstart-x7k2m9qa cancelled — Cancelled by rob.",
    ]


# --- smaller things ------------------------------------------------------------------------


def test_a_refusal_in_a_list_reads_as_sentences() -> None:
    """DRF answers a model's own refusal as {"detail": [...]} (the last admin) and a
    constraint's as {"__all__": [...]}: neither is printed as a Python list."""
    last_admin = {"detail": ["A workspace needs at least one admin: make someone else admin."]}
    assert problem_text(last_admin) == last_admin["detail"][0]
    twice = {"__all__": ["This user is already a member of this workspace."]}
    assert problem_text(twice) == "This user is already a member of this workspace."
    assert problem_text({"username": ["No user called 'x'."]}) == "username: No user called 'x'."
    # The portal's general words for a refusal about fields give way to the fields'.
    general = "The request is not valid; nothing was changed."
    assert problem_text({"detail": general, **twice}) == twice["__all__"][0]
    assert problem_text({"detail": general}) == general


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_init_lines_up_every_comment(template: str) -> None:
    """Every comment after a value starts at COMMENT_COLUMN (the name's too, whatever its
    length; after a name too long for that, one space on)."""
    for name in ("a", "my-project-2", "x" * 23, "y" * 38):
        for line in tau_yaml(template, name).splitlines():
            position = line.find(" # ")
            content = line[:position].rstrip()
            if position < 0 or not content:
                continue
            hash_at = line.index("#", len(content))
            assert hash_at == max(COMMENT_COLUMN, len(content) + 1), (template, name, line)
