"""deploy/Containerfile, read as text (tests/deploy/test_image.py builds it and looks inside
the image), and its build-time ``collectstatic`` step run against the checkout with the very
environment the Containerfile gives it.

What is checked: two stages, the final one without compilers or pip, as the unprivileged user
10001, gunicorn by default (trusting no forwarded header); dependencies installed with the
pinned constraints; every package of the portal copied in (a new app that is not would be
missing from the image); a pinned base image.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "deploy" / "Containerfile"
COMPILERS = ("gcc", "g++", "clang", "build-essential", "make", "cc ")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for word, args in self.instructions if word == keyword]


def parse() -> tuple[dict[str, str], list[Stage]]:
    """ARGs before the first FROM, and the stages with their instructions (continuation
    lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base=parts[0], name=name))
        elif not stages:
            assert word == "ARG", f"only ARG may come before FROM: {line}"
            key, _, value = rest.partition("=")
            args[key] = value
        else:
            stages[-1].instructions.append((word, rest))
    return args, stages


def test_the_image_is_built_in_two_stages_from_a_pinned_base() -> None:
    args, stages = parse()
    assert len(stages) == 2, [s.base for s in stages]
    build, final = stages
    assert build.name == "build"
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"[\w./-]+/python:3\.11\.\d+-slim-\w+", base), base
    assert final.base == build.base == "${PYTHON_IMAGE}"
    assert any("--from=build" in copy for copy in final.all("COPY"))


def test_the_final_stage_has_no_compiler_no_pip_and_no_root() -> None:
    _, (_, final) = parse()
    for run in final.all("RUN"):
        assert "apt-get install" not in run, run
        assert not any(tool in run for tool in COMPILERS if tool != "make"), run
        assert "pip install" not in run, run
    assert "pip uninstall --yes --quiet pip setuptools wheel" in " ".join(final.all("RUN"))
    (user,) = final.all("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit(), user
    assert int(uid) >= 10000, user
    assert gid.isdigit(), user
    env = " ".join(final.all("ENV"))
    for setting in (
        "TAU_ENV=production",
        "TAU_VAR_DIR=/var/lib/taugrid",
        "PYTHONPATH=/opt/taugrid/app",
    ):
        assert setting in env, setting


def test_the_default_command_is_gunicorn_trusting_no_forwarded_header() -> None:
    _, (_, final) = parse()
    (cmd,) = final.all("CMD")
    import json

    argv = json.loads(cmd)
    assert argv[:2] == ["gunicorn", "portal.wsgi:application"]
    assert argv[argv.index("--forwarded-allow-ips") + 1] == ""
    assert "--no-control-socket" in argv
    assert argv[argv.index("--worker-tmp-dir") + 1] == "/tmp"


def containerignore_lets_in() -> set[str]:
    """What .containerignore lets back into the build context after ignoring everything."""
    lines = [line.strip() for line in (REPO / ".containerignore").read_text().splitlines()]
    rules = [line for line in lines if line and not line.startswith("#")]
    assert rules[0] == "*", "the context starts from nothing"
    return {rule[1:] for rule in rules if rule.startswith("!")}


def test_dependencies_are_the_pinned_ones_and_every_package_is_copied() -> None:
    _, (build, _) = parse()
    installs = [run for run in build.all("RUN") if "pip install" in run]
    assert len(installs) == 1, installs
    assert "--constraint /opt/taugrid/build/constraints.txt" in installs[0]
    assert "--requirement /opt/taugrid/build/requirements.txt" in installs[0]
    # The dependencies come before the code, and from pyproject.toml's own lists.
    copies = build.all("COPY")
    assert copies[0].split()[:-1] == [
        "pyproject.toml",
        "requirements/constraints.txt",
        "deploy/image/requirements.py",
    ]
    assert copies[1] == ". ./"
    listed = subprocess.run(
        [sys.executable, "deploy/image/requirements.py", "pyproject.toml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert listed == [*project["dependencies"], *project["optional-dependencies"]["server"]]
    # Every package of the portal is let into the build context, with what it serves.
    allowed = containerignore_lets_in()
    found = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {p.rstrip("*") for p in found["packages"]["find"]["include"]}
    missing = packages - allowed
    assert not missing, f".containerignore leaves {sorted(missing)} out of the image"
    # And every Django app of the project is such a package (a new app left out of both
    # made the image's collectstatic fail: "No module named 'catalog'").
    from django.conf import settings

    apps = {entry.split(".")[0] for entry in settings.INSTALLED_APPS}
    ours = {app for app in apps if (REPO / app / "__init__.py").exists()}
    assert ours - packages == set(), "apps that pyproject.toml's packages leave out"
    for needed in ("templates", "static", "manage.py", "requirements/constraints.txt"):
        assert needed in allowed, needed
    assert all((REPO / path).exists() for path in allowed), allowed
    assert not {"tests", "benchmarks", "examples", ".venv", "var"} & allowed


def test_collectstatic_as_the_build_runs_it_succeeds(tmp_path: Path) -> None:
    """The build's collectstatic line, with its throwaway settings, against this checkout:
    production settings load with them and the manifest storage finds every file a
    stylesheet refers to (a missing source map once broke it)."""
    _, (build, _) = parse()
    (run,) = [run for run in build.all("RUN") if "collectstatic" in run]
    words = shlex.split(run.split("&&")[0])
    assignments = dict(word.split("=", 1) for word in words if re.match(r"^[A-Z_]+=", word))
    command = [word for word in words if not re.match(r"^[A-Z_]+=", word)]
    assert command[1:] == ["manage.py", "collectstatic", "--noinput", "--verbosity", "0"]
    assert assignments["TAU_ENV"] == "production"
    static = tmp_path / "static"
    env = {
        **assignments,
        "TAU_STATIC_ROOT": str(static),
        "TAU_VAR_DIR": str(tmp_path / "var"),
        "PATH": os.environ["PATH"],
    }
    del env["PYTHONPATH"]  # the checkout is the working directory
    done = subprocess.run(
        [sys.executable, *command[1:]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (static / "staticfiles.json").is_file()
    assert list(static.glob("vendor/plotly.min.*.js")), "plotly.js was not collected"
    assert not (tmp_path / "var").exists(), "collectstatic wrote state it should not"


@pytest.mark.parametrize("secretish", ["TAU_SECRET_KEY", "TAU_TOKEN_PEPPERS", "DATABASE_URL"])
def test_build_time_values_are_not_kept_in_the_image(secretish: str) -> None:
    """The throwaway values exist for one RUN only: never an ENV or ARG of either stage."""
    args, stages = parse()
    assert secretish not in args
    for stage in stages:
        for env in stage.all("ENV") + stage.all("ARG"):
            assert secretish not in env, env
