"""Real portal processes for end-to-end tests: a Redis of the test's own (so it can be stopped
and started again), and the web server, the Celery workers and Celery beat against the test
database. The web server is ``make run``'s own (``manage.py serve_web``: uvicorn serving
``web.asgi``), or production's gunicorn as the Helm chart starts it when a test asks."""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(check: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} did not happen within {timeout}s")


def session_database_url() -> str:
    """The database this test session uses (pytest-django's test_… copy), as a URL."""
    db = connection.settings_dict
    return f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


class PrivateRedis:
    """A redis-server only this test talks to: stop() and start() keep port and password."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.password = secrets.token_urlsafe(12)
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"redis://default:{self.password}@127.0.0.1:{self.port}/0"

    def start(self) -> None:
        server = shutil.which("redis-server")
        assert server, "redis-server is installed by make test"
        self.process = subprocess.Popen(
            [
                server,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--requirepass",
                self.password,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self.answers, timeout=20, what="redis start")

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None
        wait_for(lambda: not self.answers(), timeout=10, what="redis stop")


class Portal:
    """The web server + Celery worker + Celery beat, as ``make run`` starts them, and the
    notifications worker where a test sends notifications (``gunicorn=True``: the web server
    is production's instead)."""

    def __init__(
        self,
        *,
        broker_url: str,
        var_dir: Path,
        extra_env: dict[str, str] | None = None,
        gunicorn: bool = False,
    ) -> None:
        self.gunicorn = gunicorn
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")},
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "DATABASE_URL": session_database_url(),
            "CELERY_BROKER_URL": broker_url,
            "TAU_VAR_DIR": str(var_dir),
            "TAU_RECONCILE_SECONDS": "1",
            # Its own rate-limit counters: the session's Redis has seen other tests' bad tokens
            # from this same address.
            "TAU_CACHE_KEY_PREFIX": f"taugrid-test-{self.port}",
            # The same secrets as this test process, so tokens and sessions it makes work there.
            "TAU_SECRET_KEY": settings.SECRET_KEY,
            "TAU_TOKEN_PEPPERS": settings.TAU_TOKEN_PEPPERS,
            **(extra_env or {}),
        }
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = var_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def _spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.processes[name] = subprocess.Popen(
            command,
            cwd=ROOT,
            env=self.env if env is None else env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start(
        self,
        *,
        web: bool = True,
        worker: bool = True,
        beat: bool = True,
        notifier: bool = False,
    ) -> None:
        """Start the parts asked for. ``notifier`` (the worker of the ``notifications`` queue)
        only where the test sends notifications: each Celery worker costs ~2 s of CPU to start,
        and the suite starts some thirty portals. It is started only if it is not running
        already (a test that restarts a killed main worker keeps the notifier it has), on an
        empty queue: without a notifier, beat's reconcile tasks for it pile up there."""
        if web:
            self._spawn("web", self.web_command(), self.web_env())
            wait_for(self._healthy, timeout=60, what="the web server's start")
        if worker:
            self._spawn(
                "worker",
                [
                    str(BIN / "celery"),
                    "-A",
                    "portal",
                    "worker",
                    "--queues",
                    "celery",
                    "--concurrency",
                    "2",
                    "--loglevel",
                    "INFO",
                    "--hostname",
                    f"test-{self.port}@localhost",
                ],
            )
        # Notifications have a queue and a worker of their own (CELERY_TASK_ROUTES), as under
        # make run and in the chart: more slots than one workspace's share of them
        # (TAU_NOTIFY_WORKSPACE_CONCURRENCY, 2).
        if notifier and not self.running("notifier"):
            self.purge_queue("notifications")
            self._spawn(
                "notifier",
                [
                    str(BIN / "celery"),
                    "-A",
                    "portal",
                    "worker",
                    "--queues",
                    "notifications",
                    "--concurrency",
                    "3",
                    "--loglevel",
                    "INFO",
                    "--hostname",
                    f"notifier-{self.port}@localhost",
                ],
            )
        if beat:
            self._spawn(
                "beat",
                [
                    str(BIN / "celery"),
                    "-A",
                    "portal",
                    "beat",
                    "--loglevel",
                    "INFO",
                    "--schedule",
                    str(self.logs / "beat-schedule"),
                ],
            )

    def purge_queue(self, queue: str) -> None:
        """Drop what waits in ``queue`` on this portal's broker (earlier tests' portals left
        it there)."""
        from kombu import Connection

        with Connection(self.env["CELERY_BROKER_URL"]) as broker:
            channel: Any = broker.default_channel  # kombu's StdChannel type lacks queue_purge
            channel.queue_purge(queue)

    def web_command(self) -> list[str]:
        if not self.gunicorn:
            from web.management.commands.runportal import web_command

            return web_command("127.0.0.1", self.port)
        # As the Helm chart's web container (deploy/helm/taugrid/templates/web.yaml).
        return [
            str(BIN / "gunicorn"),
            "portal.wsgi:application",
            f"--bind=127.0.0.1:{self.port}",
            "--workers=1",
            "--threads=4",
            "--forwarded-allow-ips=",
            "--no-control-socket",
        ]

    def web_env(self) -> dict[str, str]:
        """The web server's environment: make run's (a pool of database connections) for its
        server, the chart's for gunicorn (the portal's ``extra_env`` sets its own)."""
        if self.gunicorn:
            return self.env
        from web.management.commands.runportal import web_environment

        return web_environment(self.env)

    def running(self, name: str) -> bool:
        """Whether the process ``name`` was started and has not ended."""
        process = self.processes.get(name)
        return process is not None and process.poll() is None

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as response:
                return int(response.status) == 200
        except OSError:
            return False

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")


def portal_processes(tmp_path: Path, broker_url: str, **kwargs: Any) -> Iterator[Portal]:
    portal = Portal(broker_url=broker_url, var_dir=tmp_path / "var", **kwargs)
    try:
        yield portal
    finally:
        portal.stop()


def multipart_form(
    parts: list[tuple[str, str, bytes]], boundary: str = "taugridtest"
) -> tuple[bytes, str]:
    """A multipart/form-data body of (field, file name, content) file parts, as
    `curl -F field=@file` sends them, and its Content-Type."""
    body = (
        b"".join(
            f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n".encode()
            + content
            + b"\r\n"
            for name, filename, content in parts
        )
        + f"--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


def submit_example(
    base: str, token: str, workspace: str = "demo", *, spec: str | None = None
) -> dict[str, Any]:
    """POST examples/cpu-quickstart as `curl -F spec=@tau.yaml -F bundle=@project.zip` does
    (``spec``: another tau.yaml for the same project)."""
    example = ROOT / "examples" / "cpu-quickstart"
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as bundle:
        for path in sorted(example.iterdir()):
            bundle.write(path, path.name)
    parts = [
        (
            "spec",
            "tau.yaml",
            (example / "tau.yaml").read_bytes() if spec is None else spec.encode(),
        ),
        ("bundle", "project.zip", archive.getvalue()),
    ]
    body, content_type = multipart_form(parts)
    request = urllib.request.Request(
        f"{base}/api/v1/workspaces/{workspace}/runs/",
        data=body,
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": content_type,
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 201
        return dict(json.loads(response.read()))


def get_json(url: str, token: str) -> dict[str, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.loads(response.read()))


def post_json(url: str, token: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body or {}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.loads(response.read() or b"{}"))
