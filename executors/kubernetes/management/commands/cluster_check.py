"""Validate a Kubernetes cluster for TauGrid before (or after) switching TAU_BACKEND to it.

    manage.py cluster_check [--kubeconfig PATH] [--as USER] [--json]

Checks the API server, Kueue's and KubeRay's CRD versions, Kueue's visibility API, every
permission the portal needs (deploy/rbac/), each ResourceFlavor's nodes, and GPU nodes; prints
a table (check, result, what to do) and exits 1 when a check failed (warnings do not fail).
The checks are in :mod:`executors.kubernetes.cluster_check`. The cluster is the one
``--kubeconfig``, else ``TAU_KUBECONFIG``, names, else the pod's own (in-cluster), whatever
``TAU_BACKEND`` is.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from executors.kubernetes.cluster_check import check_cluster, flavors_from_rows
from executors.kubernetes.rbac import PORTAL_NAMESPACE, PORTAL_SERVICE_ACCOUNT
from workspaces.models import ResourceFlavor


class Command(BaseCommand):
    help = (
        "Check that a Kubernetes cluster has what TauGrid needs (Kueue, KubeRay, the "
        "visibility API, the portal's permissions, flavors' nodes, GPU nodes); exit 1 if not."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--kubeconfig",
            default=None,
            help="kubeconfig to use (default: $TAU_KUBECONFIG, else in-cluster configuration)",
        )
        parser.add_argument(
            "--as",
            dest="impersonate",
            default=None,
            metavar="USER",
            help="check as this user, like kubectl --as (needs the impersonate verb), e.g. "
            f"system:serviceaccount:{PORTAL_NAMESPACE}:{PORTAL_SERVICE_ACCOUNT} to check the "
            "portal's ServiceAccount from an admin's kubeconfig",
        )
        parser.add_argument(
            "--json", action="store_true", help="print the report as JSON instead of a table"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        flavors = flavors_from_rows(ResourceFlavor.objects.order_by("name"))
        report = check_cluster(
            flavors, kubeconfig=options["kubeconfig"], impersonate_user=options["impersonate"]
        )
        self.stdout.write(report.to_json() if options["json"] else report.table())
        if not report.ok:
            failed = ", ".join(check.check for check in report.failed)
            raise CommandError(f"{len(report.failed)} check(s) failed: {failed}", returncode=1)
