"""The parts of ``tau`` that need no portal: what goes into the bundle, the config file,
``--set``, ``init``, ``validate`` and the exit codes of mistakes."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
import pytest

from tau.cli import main
from tau.cli.bundle import Ignore, project_files
from tau.cli.client import Api, CliError, _verify
from tau.cli.commands import apply_settings, sparkline
from tau.cli.config import Profile, load_profile, read_config, save_profile
from tau.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _tree(root: Path, names: list[str]) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)


def test_the_bundle_honours_tauignore_gitignore_and_the_spec(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        [
            "train.py",
            "pkg/model.py",
            "pkg/__pycache__/model.cpython-311.pyc",
            "data/train.csv",
            "data/keep.csv",
            "run.log",
            "sub/deep/run.log",
            "important.log",
            ".git/HEAD",
            "ckpt/a.ckpt",
            "notes/private.md",
        ],
    )
    (tmp_path / ".gitignore").write_text("__pycache__/\n*.log\n/notes/\n")
    (tmp_path / ".tauignore").write_text("# comment\ndata/*\n!data/keep.csv\n!important.log\n")
    ignore = Ignore.for_project(tmp_path, exclude=("**/*.ckpt",))
    assert project_files(tmp_path, ignore) == [
        ".gitignore",
        ".tauignore",
        "data/keep.csv",
        "important.log",
        "pkg/model.py",
        "train.py",
    ]


def test_an_ignored_folder_is_not_entered(tmp_path: Path) -> None:
    _tree(tmp_path, ["venv/lib/a.py", "a.py"])
    (tmp_path / ".tauignore").write_text("venv/\n!venv/lib/a.py\n")
    assert project_files(tmp_path, Ignore.for_project(tmp_path)) == [".tauignore", "a.py"]


def test_the_config_file_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("TAU_URL", "TAU_TOKEN", "TAU_WORKSPACE", "TAU_PROFILE", "TAU_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    path = save_profile(Profile("work", "https://tau.example.org", "tau_secret", "alpha"))
    assert path == tmp_path / "config" / "taugrid" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_profile(None) == Profile("work", "https://tau.example.org", "tau_secret", "alpha")
    monkeypatch.setenv("TAU_TOKEN", "tau_other")
    assert load_profile("work").token == "tau_other"
    path.chmod(0o644)
    with pytest.raises(Exception, match="chmod 600"):
        read_config()


def test_set_changes_fields_for_one_run() -> None:
    source = (EXAMPLES / "cpu-quickstart" / "tau.yaml").read_bytes()
    changed = apply_settings(
        source, ["compute.cpus=2", "run.args=[--steps, 10]", "name=other", "queue.priority=high"]
    )
    spec = load_spec(changed)
    assert (spec.name, spec.compute.cpus, spec.run.args) == ("other", "2", ("--steps", "10"))
    assert spec.queue.priority == "high"
    assert apply_settings(source, []) == source


def test_usage_mistakes_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--bogus"]) == 2
    assert main(["run", "--config", "x.yaml", "--set", "nonsense", "--dry-run"]) == 2
    assert main(["init", "--template", "tpu"]) == 2
    capsys.readouterr()


def test_not_logged_in_exits_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for name in ("TAU_URL", "TAU_TOKEN", "TAU_WORKSPACE", "TAU_PROFILE", "TAU_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    assert main(["run", "list", "--workspace", "alpha", "--json"]) == 3
    said = capsys.readouterr()
    assert "tau login" in said.err
    assert json.loads(said.out)["exit_code"] == 3


@pytest.mark.parametrize("template", ["cpu", "gpu", "torchrun"])
def test_init_writes_a_valid_commented_project(
    template: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "My Project_2"
    assert main(["init", str(folder), "--template", template]) == 0
    text = (folder / "tau.yaml").read_text()
    assert "# " in text
    assert load_spec(text).name == "my-project-2"
    assert "__pycache__/" in (folder / ".tauignore").read_text()
    assert main(["init", str(folder)]) == 2  # kept without --force
    assert main(["validate", str(folder / "tau.yaml")]) == 0
    capsys.readouterr()


def test_validate_reports_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "tau.yaml"
    bad.write_text("schema_version: 1\nname: x\nrun:\n  entrypoint: a.py\ncompute:\n  gpus: many\n")
    assert main(["run", "validate", str(bad), "--json"]) == 2
    (problem,) = json.loads(capsys.readouterr().out)
    assert (problem["path"], problem["line"], problem["column"]) == ("compute.gpus", 6, 9)
    assert main(["run", "validate", *map(str, sorted(EXAMPLES.glob("*/tau.yaml")))]) == 0
    assert main(["run", "schema"]) == 0
    assert '"$schema"' in capsys.readouterr().out


def test_completion_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    for shell in ("bash", "zsh", "fish"):
        assert main(["completion", shell]) == 0
        assert "_TAU_COMPLETE" in capsys.readouterr().out


def test_sparkline() -> None:
    assert sparkline([1, 2, 3]) == "▁▄█"
    assert len(sparkline([float(i) for i in range(1000)])) == 24


def test_a_private_ca_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ssl

    import certifi

    monkeypatch.setenv("TAU_CA_BUNDLE", certifi.where())
    assert isinstance(Api("https://tau.example.org", "t").http, httpx.Client)
    assert isinstance(_verify(), ssl.SSLContext)
    monkeypatch.setenv("TAU_CA_BUNDLE", str(tmp_path / "missing.pem"))
    with pytest.raises(CliError) as refused:
        _verify()
    assert refused.value.code == 2


@pytest.mark.parametrize(
    ("status", "body", "code", "said"),
    [
        (401, {"detail": "Invalid token."}, 3, "tau login"),
        (403, {"detail": "This needs the researcher role here."}, 3, "researcher role"),
        (404, {"detail": "No such run."}, 4, "No such run."),
        (404, "<html>nginx</html>", 4, "a TauGrid portal?"),
        (400, {"state": ["one of: pending"]}, 2, "state: one of: pending"),
        (409, {"detail": "The run has already finished."}, 1, "already finished"),
        (500, "<html>oops</html>", 1, "answered 500"),
        (200, "<html>a login page</html>", 1, "did not answer like a TauGrid portal"),
    ],
)
def test_answers_become_exit_codes(status: int, body: object, code: int, said: str) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(status, text=body, headers={"Content-Type": "text/html"})
        return httpx.Response(status, json=body)

    api = Api("https://tau.example.org", "tau_token")
    api.http = httpx.Client(base_url=api.url, transport=httpx.MockTransport(answer))
    with pytest.raises(CliError) as refused:
        api.get("/api/v1/workspaces/alpha/runs/x/")
    assert refused.value.code == code
    assert said in str(refused.value)
