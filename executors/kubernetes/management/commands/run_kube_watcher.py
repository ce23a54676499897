"""Run the Kubernetes watcher: it follows every Kubernetes run's objects to the end.

    manage.py run_kube_watcher [--identity NAME]

It runs in the foreground until SIGTERM or Ctrl-C (see ``executors.kubernetes.watcher``); ``make
run`` starts it with the web server and the Celery processes when ``TAU_BACKEND=kubernetes``, and
production runs it as one Deployment (two replicas are fine: one acts, the other waits for
the Lease ``taugrid-kube-watcher`` in ``TAU_KUBE_WATCHER_LEASE_NAMESPACE``).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

import kube
from executors.kubernetes.watcher import serve


class Command(BaseCommand):
    help = "Follow the runs on Kubernetes and record what happens to them (foreground)."
    # A daemon that serves no pages: Django's system checks would import every URLconf and
    # view into it (~0.3 s of CPU at each start). `migrate` runs them (make run and the
    # chart's migration job), and so does make run's web server.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--identity",
            default=None,
            help="the name this replica holds the Lease under (default: host-pid-random)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.TAU_BACKEND != "kubernetes":
            raise CommandError(
                f"TAU_BACKEND is {settings.TAU_BACKEND}: the Kubernetes watcher follows runs "
                "on the kubernetes backend only"
            )
        try:
            client = kube.client()
        except kube.KubeConfigError as error:
            raise CommandError(str(error)) from None
        serve(client=client, identity=options["identity"])
