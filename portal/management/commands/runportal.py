"""Run the whole portal on this machine in the foreground: web server, Celery worker and beat,
and, when runs execute on this machine (``TAU_BACKEND=local``), the local agent.

Ctrl-C (or SIGTERM) stops all of them; if one of them dies, the others are stopped too and
the command exits non-zero, so nothing is left half-running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

_GRACE_SECONDS = 10
# The agent may take its grace period (TAU_LOCAL_GRACE_SECONDS) plus recording time; it gives
# up by itself (killing its runs) 15 s after the grace period, before this runs out.
_AGENT_EXTRA_SECONDS = 30


class Command(BaseCommand):
    help = "Start the web server, a Celery worker and Celery beat; Ctrl-C stops them all."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--host", default="127.0.0.1")

    def handle(self, *args: Any, **options: Any) -> None:
        host: str = options["host"]
        port: int = options["port"]
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
                "--access-logfile",
                "-",
                "--worker-tmp-dir",
                var_dir,
            ],
            "worker": [
                os.path.join(bin_dir, "celery"),
                "-A",
                "portal",
                "worker",
                "--loglevel",
                "INFO",
                "--concurrency",
                "2",
                "--hostname",
                f"worker@{host}-{port}",
            ],
            "beat": [
                os.path.join(bin_dir, "celery"),
                "-A",
                "portal",
                "beat",
                "--loglevel",
                "INFO",
                "--schedule",
                settings.CELERY_BEAT_SCHEDULE_FILENAME,
                "--pidfile",
                os.path.join(var_dir, "celerybeat.pid"),
            ],
        }
        if settings.TAU_BACKEND == "local":
            # Executes queued local runs as process groups on this machine (runs.agent).
            commands["agent"] = [python, os.path.join(settings.BASE_DIR, "manage.py"), "run_agent"]
        processes: dict[str, subprocess.Popen[bytes]] = {}
        stopping = False
        failed: str | None = None

        def stop(*_: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            for name, command in commands.items():
                # Own process group: a terminal Ctrl-C reaches us once, and we stop the children.
                processes[name] = subprocess.Popen(command, start_new_session=True)  # noqa: S603
                self.stdout.write(f"started {name} (pid {processes[name].pid})")
            self.stdout.write(
                self.style.SUCCESS(
                    f"TauGrid is up at http://{host}:{port}/ — press Ctrl-C to stop."
                )
            )
            while not stopping and failed is None:
                time.sleep(0.5)
                for name, process in processes.items():
                    if process.poll() is not None:
                        failed = name
                        break
        finally:
            self._stop_all(processes)
        if failed is not None:
            raise CommandError(
                f"{failed} exited with code {processes[failed].returncode}; stopped the rest"
            )
        self.stdout.write("stopped.")

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


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, signum)
