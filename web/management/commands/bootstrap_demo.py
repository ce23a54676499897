"""Create the demo platform admin, a ``demo`` workspace and a researcher in it (idempotent).

Passwords are generated on first use and kept in ``var/demo-credentials.json`` (readable only
by the owner), so a demo portal never ships with a password everyone knows.

The workspace's quota is this machine's (flavor ``local``: 4 CPUs, 8 GiB). On the Kubernetes
backend, the test cluster of docs/kubernetes.md (``make cluster-up``), it also gets the GPU pool of
that cluster (flavor ``h100``: the labels and taint of deploy/cluster/nodes/gpu-h100.yaml, 8 GPUs,
64 CPUs and 512 GiB on it), so the GPU example of docs/kubernetes.md can run there; a flavor of that
name that exists already is used as it is.
"""

from __future__ import annotations

import json
import os
import secrets
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from portal import audit
from workspaces.models import Membership, ResourceFlavor, Role, Workspace, WorkspaceQuota

#: The test cluster's GPU pool (deploy/cluster/nodes/gpu-h100.yaml), for the Kubernetes backend.
TEST_CLUSTER_GPU_FLAVOR = {
    "name": "h100",
    "gpu_model": "NVIDIA-H100-80GB-HBM3",
    "node_labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "description": "The test cluster's fake H100 nodes (make cluster-up).",
}
TEST_CLUSTER_GPU_QUOTA = (
    ("nvidia.com/gpu", Decimal(8)),
    ("cpu", Decimal(64)),
    ("memory", Decimal(512 * 2**30)),
)

DEMO_USERS = {
    "admin": {
        "is_staff": True,
        "is_superuser": True,
        "first_name": "Platform",
        "last_name": "Admin",
    },
    "researcher": {
        "is_staff": False,
        "is_superuser": False,
        "first_name": "Demo",
        "last_name": "Researcher",
    },
}


# What each demo account is for, in the login details `make run` prints.
DEMO_ROLES = {
    "admin": "platform admin",
    "researcher": "researcher in the demo workspace",
}


def credentials_path() -> Path:
    return Path(settings.VAR_DIR) / "demo-credentials.json"


def stored_passwords() -> dict[str, str] | None:
    """The demo passwords kept by an earlier run of this command, if there are any. A file
    left readable by others (an older version, a copy) is made the portal's alone again."""
    path = credentials_path()
    try:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or not set(DEMO_USERS) <= set(stored):
        return None
    return {username: str(stored[username]) for username in DEMO_USERS}


def login_lines(passwords: dict[str, str]) -> list[str]:
    return [
        f"  {username:<11} password: {passwords[username]}   ({DEMO_ROLES[username]})"
        for username in DEMO_USERS
    ]


def load_or_create_passwords() -> dict[str, str]:
    stored = stored_passwords()
    if stored is not None:
        return stored
    path = credentials_path()
    passwords = {username: secrets.token_urlsafe(12) for username in DEMO_USERS}
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # also when the file was there already, with another mode
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(passwords, handle, indent=2)
    return passwords


class Command(BaseCommand):
    help = "Create the demo admin, the demo workspace and its researcher (safe to run again)."

    def handle(self, *args: Any, **options: Any) -> None:
        if settings.PRODUCTION:
            raise CommandError(
                "bootstrap_demo creates known accounts; it refuses to run in production"
            )
        passwords = load_or_create_passwords()
        user_model = get_user_model()
        with transaction.atomic(), audit.acting_as(None, source="cli"):
            users = {}
            for username, attributes in DEMO_USERS.items():
                user, created = user_model._default_manager.get_or_create(
                    username=username, defaults=attributes
                )
                if created or not user.check_password(passwords[username]):
                    user.set_password(passwords[username])
                    user.save()
                users[username] = user
            flavor, _ = ResourceFlavor.objects.get_or_create(
                name="local",
                defaults={"description": "This machine (the embedded default)."},
            )
            workspace, _ = Workspace.unscoped_objects.get_or_create(
                slug="demo",
                defaults={
                    "name": "Demo workspace",
                    "description": "A workspace to try TauGrid in.",
                    "namespace": "tau-demo",
                    "local_queue": "demo",
                    "default_image": settings.TAU_DEFAULT_IMAGE,
                },
            )
            Membership.objects.get_or_create(
                workspace=workspace, user=users["researcher"], defaults={"role": Role.RESEARCHER}
            )
            for resource, amount in (("cpu", Decimal(4)), ("memory", Decimal(8 * 2**30))):
                WorkspaceQuota.objects.get_or_create(
                    workspace=workspace,
                    flavor=flavor,
                    resource=resource,
                    defaults={"nominal": amount},
                )
            if settings.TAU_BACKEND == "kubernetes":
                fields = dict(TEST_CLUSTER_GPU_FLAVOR)
                gpu_flavor, _ = ResourceFlavor.objects.get_or_create(
                    name=fields.pop("name"), defaults=fields
                )
                for resource, amount in TEST_CLUSTER_GPU_QUOTA:
                    WorkspaceQuota.objects.get_or_create(
                        workspace=workspace,
                        flavor=gpu_flavor,
                        resource=resource,
                        defaults={"nominal": amount},
                    )
        # `make run` asks for silence (-v 0): runportal prints the login details once the
        # portal answers, where they are not pushed out of sight by the servers' start-up.
        if options["verbosity"] >= 1:
            self.stdout.write(self.style.SUCCESS("Demo accounts are ready:"))
            for line in login_lines(passwords):
                self.stdout.write(line)
            self.stdout.write(f"  (kept in {credentials_path()})")
