"""Run the whole portal on this machine in the foreground: web server, Celery worker and beat,
and, when runs execute on this machine (``TAU_BACKEND=local``), the local agent, or, when
they run on Kubernetes (``TAU_BACKEND=kubernetes``), the Kubernetes watcher.

Ctrl-C (or SIGTERM) stops all of them; if one of them dies, the others are stopped too and
the command exits non-zero, so nothing is left half-running.

The console is for the person who typed ``make run``: the servers start quietly (warnings
and errors only, no banners), their output comes through this process line by line, and
once the web server answers and the agent has started, the address and the demo logins are
printed last, where they stay in sight.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import IO, Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, OutputWrapper

from web.management.commands.bootstrap_demo import (
    credentials_path,
    login_lines,
    stored_passwords,
)

_GRACE_SECONDS = 10
# The agent may take its grace period (TAU_LOCAL_GRACE_SECONDS) plus recording time; it gives
# up by itself (killing its runs) 15 s after the grace period, before this runs out.
_AGENT_EXTRA_SECONDS = 30
# How long start-up may take before the address is printed anyway.
_READY_TIMEOUT_SECONDS = 120
# The line runs.agent logs once it holds its lock and serves (at INFO).
_AGENT_STARTED = "local agent started"
# Celery's multi-line warning about running as root; said once, in our words, instead.
_CELERY_ROOT_WARNING = "ignore:You're running the worker with superuser privileges"


class Command(BaseCommand):
    help = "Start the web server, a Celery worker and Celery beat; Ctrl-C stops them all."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--host", default="127.0.0.1")

    def handle(self, *args: Any, **options: Any) -> None:
        host: str = options["host"]
        port: int = options["port"]
        url = f"http://{host}:{port}/"
        commands = self._commands(host, port)
        console = _Console(self.stdout)
        processes: dict[str, subprocess.Popen[bytes]] = {}
        # A plain flag: a signal handler must not take locks (threading.Event.set does).
        stopping = _Flag()

        def first_exited() -> str | None:
            return next((name for name, p in processes.items() if p.poll() is not None), None)

        signal.signal(signal.SIGINT, stopping.set)
        signal.signal(signal.SIGTERM, stopping.set)
        agent_started = console.watch("agent", _AGENT_STARTED)
        environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
        console.say(f"Starting {_names(list(commands))}…")
        if os.geteuid() == 0 and "agent" in commands:
            # Celery's own warning about root (a screenful, about pickle, which the portal
            # does not accept) is silenced; this is what running as root means here.
            console.say(
                "Note: running as root, so the runs the local agent executes run as root too. "
                "Use an ordinary user account for anything but a quick try."
            )
        failed: str | None = None
        try:
            for name, command in commands.items():
                env = environment
                if name == "worker":
                    warnings = ",".join(
                        filter(None, [env.get("PYTHONWARNINGS"), _CELERY_ROOT_WARNING])
                    )
                    env = {**env, "PYTHONWARNINGS": warnings}
                # Own process group: a terminal Ctrl-C reaches us once, and we stop the children.
                processes[name] = subprocess.Popen(  # noqa: S603
                    command,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                console.follow(name, processes[name])
            ready: list[Callable[[], bool]] = [
                lambda: _answers(f"http://{_local(host)}:{port}/healthz")
            ]
            if "agent" in commands and logging.getLogger("runs.agent").isEnabledFor(logging.INFO):
                ready.append(agent_started.is_set)
            failed = _wait_until_ready(ready, stopping, first_exited)
            if not stopping.raised and failed is None:
                self._print_login(console, url)
            while not stopping.raised and failed is None:
                time.sleep(0.5)
                failed = first_exited()
        finally:
            self._stop_all(processes)
            console.finish()
        if failed is not None:
            raise CommandError(
                f"{failed} exited with code {processes[failed].returncode}; stopped the rest"
            )
        console.say("stopped.")

    def _commands(self, host: str, port: int) -> dict[str, list[str]]:
        python = sys.executable
        bin_dir = os.path.dirname(python)
        var_dir = str(settings.VAR_DIR)
        commands = {
            "web": [
                os.path.join(bin_dir, "gunicorn"),
                "portal.wsgi:application",
                "--bind",
                f"{host}:{port}",
                "--workers",
                "2",
                "--threads",
                "4",
                # Start-up chatter off; the portal's own log shows refused requests and errors.
                "--log-level",
                "warning",
                "--worker-tmp-dir",
                var_dir,
                # gunicorn >= 25.1 opens a control socket for gunicornc in ~/.gunicorn; the
                # portal does not use it, and everything make run writes stays under var/.
                "--no-control-socket",
                # gunicorn trusts X-Forwarded-Proto from 127.0.0.1 by default, and local runs
                # connect from there too: trust nobody here; TAU_TRUSTED_PROXIES decides
                # in portal.middleware.TrustedProxyMiddleware.
                "--forwarded-allow-ips",
                "",
            ],
            "worker": [
                os.path.join(bin_dir, "celery"),
                "-A",
                "portal",
                "--quiet",  # no banner
                "worker",
                # INFO would print three lines for every reconcile pass (every 15 s).
                "--loglevel",
                "WARNING",
                "--concurrency",
                "2",
                "--hostname",
                f"worker@{host}-{port}",
            ],
            "beat": [
                os.path.join(bin_dir, "celery"),
                "-A",
                "portal",
                "--quiet",
                "beat",
                "--loglevel",
                "WARNING",
                "--schedule",
                settings.CELERY_BEAT_SCHEDULE_FILENAME,
                "--pidfile",
                os.path.join(var_dir, "celerybeat.pid"),
            ],
        }
        manage = os.path.join(settings.BASE_DIR, "manage.py")
        if settings.TAU_BACKEND == "local":
            # Executes queued local runs as process groups on this machine (runs.agent).
            commands["agent"] = [python, manage, "run_agent"]
        elif settings.TAU_BACKEND == "kubernetes":
            # Follows the runs' objects on the cluster to the end (runs.kube_watcher).
            commands["watcher"] = [python, manage, "run_kube_watcher"]
        return commands

    def _print_login(self, console: _Console, url: str) -> None:
        passwords = None if settings.PRODUCTION else stored_passwords()
        lines = ["", self.style.SUCCESS(f"TauGrid is up at {url}")]
        if passwords:
            lines += [
                "Log in with one of the demo accounts:",
                *login_lines(passwords),
                f"(the passwords are kept in {credentials_path()})",
            ]
        lines += ["Press Ctrl-C to stop.", ""]
        console.say(*lines)

    def _stop_all(self, processes: dict[str, subprocess.Popen[bytes]]) -> None:
        # SIGTERM to each leader only: gunicorn and celery stop their own children gracefully,
        # and the agent stops its runs (each with its own grace period) before it exits. The
        # runs live in process groups of their own, so killing the agent's group would not
        # reach them: it gets the time it needs.
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
        started = time.monotonic()
        for name, process in processes.items():
            grace = _GRACE_SECONDS
            if name == "agent":
                grace = settings.TAU_LOCAL_GRACE_SECONDS + _AGENT_EXTRA_SECONDS
            remaining = max(0.1, started + grace - time.monotonic())
            try:
                process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()


class _Flag:
    raised = False

    def set(self, *_: Any) -> None:
        self.raised = True


class _Console:
    """Our stdout, shared by this command and the children's output, one whole line at a
    time (lines of different processes never interleave), noticing what the children say."""

    def __init__(self, out: OutputWrapper) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._watches: dict[str, list[tuple[str, threading.Event]]] = {}
        self._threads: list[threading.Thread] = []

    def say(self, *lines: str) -> None:
        with self._lock:
            for line in lines:
                self._out.write(line)
            self._out.flush()

    def watch(self, name: str, text: str) -> threading.Event:
        """An event set once the child ``name`` has printed a line containing ``text``."""
        seen = threading.Event()
        self._watches.setdefault(name, []).append((text, seen))
        return seen

    def follow(self, name: str, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        thread = threading.Thread(
            target=self._copy, args=(name, process.stdout), name=f"output-{name}", daemon=True
        )
        thread.start()
        self._threads.append(thread)

    def _copy(self, name: str, pipe: IO[bytes]) -> None:
        with pipe:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                self.say(line)
                for text, seen in self._watches.get(name, []):
                    if text in line:
                        seen.set()

    def finish(self) -> None:
        """Wait for the last words of the children (a grandchild may keep a pipe open)."""
        deadline = time.monotonic() + 5
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _wait_until_ready(
    checks: list[Callable[[], bool]],
    stopping: _Flag,
    first_exited: Callable[[], str | None],
) -> str | None:
    """Wait until every check has passed once (or start-up takes too long, or we are told to
    stop); the name of a process that exited meanwhile, if one did."""
    pending = list(checks)
    deadline = time.monotonic() + _READY_TIMEOUT_SECONDS
    while pending and not stopping.raised and time.monotonic() < deadline:
        failed = first_exited()
        if failed is not None:
            return failed
        pending = [check for check in pending if not check()]
        time.sleep(0.2)
    return first_exited()


def _names(names: list[str]) -> str:
    words = {
        "web": "the web server",
        "worker": "a Celery worker",
        "beat": "Celery beat",
        "agent": "the local agent",
        "watcher": "the Kubernetes watcher",
    }
    spelled = [words.get(name, name) for name in names]
    return spelled[0] if len(spelled) == 1 else f"{', '.join(spelled[:-1])} and {spelled[-1]}"


def _local(host: str) -> str:
    """Where this machine reaches a server bound to ``host``."""
    if host in {"", "0.0.0.0"}:  # noqa: S104 - a comparison, not a bind
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - our own server
            return int(response.status) == 200
    except OSError:
        return False


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, signum)
