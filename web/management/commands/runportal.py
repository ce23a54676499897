"""Run the whole portal on this machine in the foreground: the web server, a Celery worker,
a second Celery worker for notifications, Celery beat and, when runs execute on this machine
(``TAU_BACKEND=local``), the local agent, or, when they run on Kubernetes
(``TAU_BACKEND=kubernetes``), the Kubernetes watcher.

The web server is uvicorn serving Django's ASGI handler (``manage.py serve_web``,
``web.http_server`` and ``web.asgi``), chosen for slow clients: a client that connects and
sends nothing, or declares a body and never sends it, costs a coroutine, not one of a few
threads, so a dozen of them (from a run on this machine, or anyone local) cannot stop the
portal answering, as they stopped gunicorn's sync workers. Every route has a body limit,
refused before reading, and every request a deadline for its headers and its body.

Notifications (e-mail, webhooks) have a worker of their own (``notifier``, the
``notifications`` queue): a slow webhook receiver holds one of its two slots at worst, never
the worker that hands runs over (``-Q celery``).

Supervised: a process that stops (a crash, a kill -9) is started again at once, and if it
keeps stopping soon after its start, after a pause that doubles each time (up to
:data:`_MAX_PAUSE_SECONDS`); a run in the local agent's care is taken over by the next agent
(it closes the attempt and the run is retried, as after any agent restart), and
the console says so once: one line when it stops, one more if it keeps stopping (its output
then goes to ``var/logs/<name>.log`` instead of the console, so nothing repeats on screen),
and one when it stays up again. Only Ctrl-C (or SIGTERM) stops everything. A process that
stops during start-up is different: something is wrong with the installation (a port in
use, a broken database), so everything is stopped and the command says which one and exits
non-zero, instead of trying again for ever.

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
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, OutputWrapper

from web.management.commands.bootstrap_demo import (
    credentials_path,
    login_lines,
    stored_passwords,
)

_GRACE_SECONDS = 10
# A stopped process is started again at once the first time; if it stops again within
# _STABLE_SECONDS of its start, after _FIRST_PAUSE_SECONDS, doubling each time it does, up to
# _MAX_PAUSE_SECONDS.
_FIRST_PAUSE_SECONDS = 1.0
_MAX_PAUSE_SECONDS = 30.0
_STABLE_SECONDS = 30.0
# The agent may take its grace period (TAU_LOCAL_GRACE_SECONDS) plus recording time; it gives
# up by itself (killing its runs) 15 s after the grace period, before this runs out.
_AGENT_EXTRA_SECONDS = 30
# How long start-up may take before the address is printed anyway.
_READY_TIMEOUT_SECONDS = 120
# The line executors.local.agent logs once it holds its lock and serves (at INFO).
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
        # A plain flag: a signal handler must not take locks (threading.Event.set does).
        stopping = _Flag()
        signal.signal(signal.SIGINT, stopping.set)
        signal.signal(signal.SIGTERM, stopping.set)
        agent_started = console.watch("agent", _AGENT_STARTED)
        console.say(f"Starting {_names(list(commands))}…")
        if os.geteuid() == 0 and "agent" in commands:
            # Celery's own warning about root (a screenful, about pickle, which the portal
            # does not accept) is silenced; this is what running as root means here.
            console.say(
                "Note: running as root. Each run the local agent executes gets a user id of "
                "its own in its sandbox; without a sandbox (the agent says so) runs would run "
                "as root. Use an ordinary user account for anything but a quick try."
            )
        supervisor = _Supervisor(commands, _environments(commands), console, Path(settings.VAR_DIR))
        failed: str | None = None
        try:
            supervisor.start_all()
            ready: list[Callable[[], bool]] = [
                lambda: _answers(f"http://{_local(host)}:{port}/healthz")
            ]
            if "agent" in commands and logging.getLogger("executors.local.agent").isEnabledFor(
                logging.INFO
            ):
                ready.append(agent_started.is_set)
            failed = _wait_until_ready(ready, stopping, supervisor.first_exited)
            if not stopping.raised and failed is None:
                self._print_login(console, url)
                while not stopping.raised:
                    time.sleep(0.2)
                    supervisor.tend()
        finally:
            supervisor.stop_all()
            console.finish()
        if failed is not None:
            raise CommandError(
                f"{_names([failed])} exited during start-up with "
                f"{_how(supervisor.returncode(failed))}; stopped the rest"
            )
        console.say("stopped.")

    def _commands(self, host: str, port: int) -> dict[str, list[str]]:
        python = sys.executable
        bin_dir = os.path.dirname(python)
        var_dir = str(settings.VAR_DIR)
        commands = {
            # uvicorn (module docstring); it believes no X-Forwarded-* header: the portal
            # decides from TAU_TRUSTED_PROXIES (portal.middleware.TrustedProxyMiddleware).
            "web": web_command(host, port),
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
                # Everything but notifications: run hand-off never waits behind a webhook.
                "--queues",
                "celery",
                "--hostname",
                f"worker@{host}-{port}",
            ],
            "notifier": [
                os.path.join(bin_dir, "celery"),
                "-A",
                "portal",
                "--quiet",
                "worker",
                "--loglevel",
                "WARNING",
                # More slots than one workspace may take (TAU_NOTIFY_WORKSPACE_CONCURRENCY):
                # a workspace's slow receivers never hold every slot.
                "--concurrency",
                "3",
                "--queues",
                "notifications",
                "--hostname",
                f"notifier@{host}-{port}",
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
            # Executes queued local runs as process groups on this machine (executors.local.agent).
            commands["agent"] = [python, manage, "run_agent"]
        elif settings.TAU_BACKEND == "kubernetes":
            # Follows the runs' objects on the cluster to the end (executors.kubernetes.watcher).
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


def web_command(host: str, port: int) -> list[str]:
    """The web server as ``make run`` starts it (tests start the same, with
    :func:`web_environment`)."""
    manage = os.path.join(settings.BASE_DIR, "manage.py")
    return [sys.executable, manage, "serve_web", "--host", host, "--port", str(port)]


#: A pool of database connections for the web server (on PostgreSQL; SQLite ignores it): it
#: answers each request in a thread of its own, so a kept connection would be one per thread
#: (``portal.env.parse_database_url``).
WEB_POOL_SIZE = "4"


def web_environment(environment: dict[str, str]) -> dict[str, str]:
    """``environment`` for the web server: with a pool of connections unless it names one."""
    return {"TAU_DB_POOL_SIZE": WEB_POOL_SIZE, **environment}


def _environments(commands: dict[str, list[str]]) -> dict[str, dict[str, str]]:
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    celery_quiet = ",".join(filter(None, [environment.get("PYTHONWARNINGS"), _CELERY_ROOT_WARNING]))
    return {
        name: (
            {**environment, "PYTHONWARNINGS": celery_quiet}
            if name in ("worker", "notifier")
            else web_environment(environment)
            if name == "web"
            else environment
        )
        for name in commands
    }


def _how(returncode: int | None) -> str:
    """How a process ended, in words: "exit code 1", "signal SIGKILL"."""
    if returncode is None:
        return "no exit code"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


class _Child:
    """One supervised process: its command, the running process, and how its restarts go."""

    def __init__(self, name: str, command: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.command = command
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.stops = 0  # stops in a row, each soon after its start
        self.restart_at: float | None = None


class _Supervisor:
    """Starts the processes, starts a stopped one again with back-off and says so once, and
    stops them all (module docstring)."""

    def __init__(
        self,
        commands: dict[str, list[str]],
        environments: dict[str, dict[str, str]],
        console: _Console,
        var_dir: Path,
    ) -> None:
        self.children = {
            name: _Child(name, command, environments[name]) for name, command in commands.items()
        }
        self.console = console
        self.logs = var_dir / "logs"

    def start_all(self) -> None:
        for child in self.children.values():
            self._start(child)

    def first_exited(self) -> str | None:
        return next(
            (
                name
                for name, child in self.children.items()
                if child.process is not None and child.process.poll() is not None
            ),
            None,
        )

    def returncode(self, name: str) -> int | None:
        process = self.children[name].process
        return None if process is None else process.returncode

    def tend(self) -> None:
        """Notice stopped processes and start the ones whose pause is over."""
        now = time.monotonic()
        for child in self.children.values():
            process = child.process
            if process is not None and _ended(process):
                self._stopped(child, process, now)
            elif child.restart_at is not None and now >= child.restart_at:
                child.restart_at = None
                self._start(child)
            elif process is not None and child.stops and now - child.started_at > _STABLE_SECONDS:
                # Up long enough: the stops are over (said, if they were said twice).
                if child.stops > 1:
                    self.console.say(f"{_capitalised(_names([child.name]))} is running again.")
                child.stops = 0

    def _stopped(self, child: _Child, process: subprocess.Popen[bytes], now: float) -> None:
        # Whatever it left in its group (a Celery pool child) goes with it; the agent's runs
        # have groups of their own and stay: the next agent takes them over.
        _signal_group(process, signal.SIGKILL)
        process.wait()  # reaped only now: until then its pid, the group's id, stays ours
        child.process = None
        if now - child.started_at > _STABLE_SECONDS:
            child.stops = 0
        child.stops += 1
        pause = (
            0.0
            if child.stops == 1
            else min(_MAX_PAUSE_SECONDS, _FIRST_PAUSE_SECONDS * 2 ** (child.stops - 2))
        )
        child.restart_at = now + pause
        name = _capitalised(_names([child.name]))
        if child.stops == 1:
            self.console.say(
                f"{name} stopped unexpectedly ({_how(process.returncode)}); starting it again."
            )
        elif child.stops == 2:
            self.console.say(
                f"{name} stopped again ({_how(process.returncode)}); starting it again with "
                f"growing pauses (up to {_MAX_PAUSE_SECONDS:.0f} s) until it stays up, its "
                f"output meanwhile in {self.logs / (child.name + '.log')}. Ctrl-C stops "
                "everything."
            )

    def _start(self, child: _Child) -> None:
        log: IO[bytes] | None = None
        if child.stops >= 2:
            # Keeps stopping: its output (the same error each time) goes to a file.
            self.logs.mkdir(parents=True, exist_ok=True)
            log = open(self.logs / f"{child.name}.log", "ab")  # noqa: SIM115 - given to the child
        try:
            # Own process group: a terminal Ctrl-C reaches us once, and we stop the children.
            child.process = subprocess.Popen(  # noqa: S603
                child.command,
                env=child.env,
                stdin=subprocess.DEVNULL,
                stdout=log if log is not None else subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if log is not None:
                log.close()  # the child has its own copy
        child.started_at = time.monotonic()
        if log is None:
            self.console.follow(child.name, child.process)

    def stop_all(self) -> None:
        # SIGTERM to each leader only: uvicorn and celery stop their own children gracefully,
        # and the agent stops its runs (each with its own grace period) before it exits. The
        # runs live in process groups of their own, so killing the agent's group would not
        # reach them: it gets the time it needs.
        running = {
            name: child.process
            for name, child in self.children.items()
            if child.process is not None
        }
        for process in running.values():
            if process.poll() is None:
                process.terminate()
        started = time.monotonic()
        for name, process in running.items():
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
        "notifier": "the notifications worker",
        "beat": "Celery beat",
        "agent": "the local agent",
        "watcher": "the Kubernetes watcher",
    }
    spelled = [words.get(name, name) for name in names]
    return spelled[0] if len(spelled) == 1 else f"{', '.join(spelled[:-1])} and {spelled[-1]}"


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]


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


def _ended(process: subprocess.Popen[bytes]) -> bool:
    """Whether the child has ended, without reaping it: while it is a zombie its pid, and so
    its process group's id, cannot be given to another process, so what it left in its group
    can still be signalled without the risk of reaching a stranger's group."""
    if process.returncode is not None:
        return True
    try:
        ended = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return process.poll() is not None
    return ended is not None and ended.si_pid != 0


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    if process.returncode is not None:
        return  # reaped: its number may name another process's group by now
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, signum)
