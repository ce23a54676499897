"""The demo bootstrap, and `make run`'s process supervisor started the way `make run` does."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from portal.models import AuditEvent
from tests.runs.processes import free_port, get_json, submit_example
from workspaces.models import Membership, Workspace, WorkspaceQuota

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_bootstrap_demo_is_idempotent(tmp_path: Path, django_user_model: Any) -> None:
    with override_settings(VAR_DIR=tmp_path):
        call_command("bootstrap_demo", stdout=open(os.devnull, "w"))  # noqa: SIM115
        first_events = AuditEvent.objects.unscoped().count()
        call_command("bootstrap_demo", stdout=open(os.devnull, "w"))  # noqa: SIM115
    assert AuditEvent.objects.unscoped().count() == first_events
    admin = django_user_model.objects.get(username="admin")
    assert admin.is_staff
    assert admin.is_superuser
    demo = Workspace.unscoped_objects.get(slug="demo")
    roles = {
        m.user.username: m.role
        for m in Membership.objects.for_workspace(demo).select_related("user")
    }
    assert roles == {"researcher": "researcher"}
    assert WorkspaceQuota.objects.for_workspace(demo).count() == 2
    passwords = json.loads((tmp_path / "demo-credentials.json").read_text())
    assert admin.check_password(passwords["admin"])
    assert oct((tmp_path / "demo-credentials.json").stat().st_mode & 0o777) == "0o600"


@pytest.mark.django_db
def test_bootstrap_demo_refuses_production() -> None:
    with (
        override_settings(PRODUCTION=True),
        pytest.raises(CommandError, match="refuses to run in production"),
    ):
        call_command("bootstrap_demo")


def wait_for(url: str, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError as exc:
            last = exc
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {timeout}s: {last}")


def processes_mentioning(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry.name))
    return found


#: What the test suite itself writes at the top of the checkout (.gitignore): pytest's cache
#: when a lane's pass ends, Hypothesis' examples, the browser tests' screenshots.
SUITE_OUTPUTS = frozenset({".pytest_cache", ".hypothesis", "test-artifacts"})


@pytest.mark.services
def test_the_embedded_default_runs_with_no_services(tmp_path: Path) -> None:
    """What `make run` does, on a fresh var/ with nothing configured: SQLite, filesystem broker."""
    env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
    env["TAU_VAR_DIR"] = str(tmp_path / "var")
    port = free_port()
    manage = [sys.executable, "manage.py"]
    top_level_before = set(os.listdir(ROOT))
    for step in (["migrate", "--noinput"], ["bootstrap_demo"]):
        done = subprocess.run(
            [*manage, *step], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
    assert "researcher  password:" in done.stdout
    portal = subprocess.Popen(
        [*manage, "runportal", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(f"{base}/healthz") == 200
        assert wait_for(f"{base}/readyz") == 200
        # Log in as the demo researcher through the real login form.
        password = json.loads((tmp_path / "var" / "demo-credentials.json").read_text())[
            "researcher"
        ]
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        form = opener.open(f"{base}/login/", timeout=10).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
        assert token is not None
        body = urllib.parse.urlencode(
            {"username": "researcher", "password": password, "csrfmiddlewaretoken": token.group(1)}
        ).encode()
        home = opener.open(
            urllib.request.Request(
                f"{base}/login/", data=body, headers={"Referer": f"{base}/login/"}
            ),
            timeout=10,
        )
        page = home.read().decode()
        assert home.geturl() == f"{base}/"
        assert "Demo workspace" in page
        assert processes_mentioning(f"worker@127.0.0.1-{port}"), "no Celery worker was started"
        # The curl of docs/runs.md: a token from create_token, the example submitted in one
        # request, followed until it succeeds: worker, beat and the local agent all at work.
        api_token = subprocess.run(
            [*manage, "create_token", "researcher", "--workspace", "demo"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.strip()
        run = submit_example(base, api_token)
        assert run["state"] == "pending"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            state = get_json(f"{base}{run['url']}", api_token)["state"]
            if state in {"succeeded", "failed", "cancelled"}:
                break
            time.sleep(1)
        assert state == "succeeded", get_json(f"{base}{run['url']}", api_token)
        log = get_json(f"{base}{run['url']}logs/?tail=5", api_token)["text"]
        assert "done: step" in log
    finally:
        portal.send_signal(signal.SIGINT)
        try:
            output, _ = portal.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            portal.kill()
            output, _ = portal.communicate()
    assert portal.returncode == 0, output[-3000:]
    # Everything it wrote went under TAU_VAR_DIR, nothing into the checkout (but for what the
    # suite's other tests write there meanwhile: make test runs them beside this one).
    assert set(os.listdir(ROOT)) - top_level_before - SUITE_OUTPUTS == set()
    assert "stopped." in output
    # Ctrl-C stopped everything it started: no worker left, the port is free.
    assert processes_mentioning(f"worker@127.0.0.1-{port}") == []
    with socket.socket() as sock:
        # SO_REUSEADDR ignores connections in TIME_WAIT, not a listener still holding the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()
