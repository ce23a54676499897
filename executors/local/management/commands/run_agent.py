"""Run the local executor: the agent that executes this machine's queued local runs.

    manage.py run_agent [--interval SECONDS] [--grace-seconds SECONDS]

It runs in the foreground until SIGTERM or Ctrl-C (see ``executors.local.agent``); ``make run``
starts it together with the web server and the Celery processes when ``TAU_BACKEND=local``. At start
it probes for the bubblewrap sandbox and says in its log what it found; without one it runs
the workloads of one workspace only, unless ``TAU_LOCAL_EXECUTOR_UNSANDBOXED=true``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from executors.local.agent.supervisor import Agent, AgentConflict
from tau.quantity import QuantityError


class Command(BaseCommand):
    help = "Execute queued local runs on this machine (foreground; Ctrl-C stops it)."
    # A daemon that serves no pages: Django's system checks would import every URLconf and
    # view into it (~0.3 s of CPU at each start). `migrate` runs them (make run and the
    # chart's migration job), and so does make run's web server.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--interval",
            type=float,
            default=0.5,
            help="seconds between two passes of the loop (default 0.5)",
        )
        parser.add_argument(
            "--grace-seconds",
            type=float,
            default=None,
            help="seconds between SIGTERM and SIGKILL when stopping a run "
            f"(default TAU_LOCAL_GRACE_SECONDS, now {settings.TAU_LOCAL_GRACE_SECONDS})",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.TAU_LOCAL_EXECUTOR:
            raise CommandError(
                "the local executor is off (TAU_LOCAL_EXECUTOR=false): it runs submitted code "
                "as this user on this machine, so it must be switched on deliberately"
            )
        interval: float = options["interval"]
        if interval <= 0:
            raise CommandError("--interval must be more than 0")
        grace: float | None = options["grace_seconds"]
        if grace is not None and grace < 0:
            raise CommandError("--grace-seconds must be 0 or more")
        try:
            agent = Agent(interval=interval, grace=grace)
        except QuantityError as exc:
            raise CommandError(f"TAU_LOCAL_MEMORY: {exc}") from None
        except ImproperlyConfigured as exc:  # TAU_LOCAL_RUN_DISK
            raise CommandError(str(exc)) from None
        try:
            agent.serve()
        except AgentConflict as exc:
            raise CommandError(str(exc)) from None
