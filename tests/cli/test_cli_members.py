"""``tau workspace members list|add|set-role|remove`` as a workspace admin uses them: the
``tau`` command in a subprocess against a live portal on PostgreSQL, with each answer's exact
words and exit code, the JSON a script gets, and the audit log; then what ``tau`` says of a
run the portal refuses, a run with no log yet and cancelling it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from identity import tokens
from portal.models import AuditEvent
from tests.conftest import make_workspace
from tests.executors.local.agent_harness import local_quota
from tests.runs.processes import ROOT
from workspaces.models import Membership, Role

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

TAU = Path(sys.executable).parent / "tau"
LAST_ADMIN = "tau: A workspace needs at least one admin: make someone else admin first.\n"


class Tau:
    """``tau`` as one user, with TAU_URL, TAU_TOKEN and TAU_WORKSPACE set (as in CI)."""

    def __init__(self, url: str, token: str, home: Path) -> None:
        self.env = {
            "PATH": os.environ.get("PATH", ""),
            "LANG": "C.UTF-8",
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / "config"),
            "NO_PROXY": "127.0.0.1,localhost",
            "TAU_URL": url,
            "TAU_TOKEN": token,
            "TAU_WORKSPACE": "alpha",
        }

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(TAU), *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=ROOT,
            timeout=120,
        )

    def json(self, *args: str) -> Any:
        done = self(*args, "--json")
        assert done.returncode == 0, done.stderr + done.stdout
        return json.loads(done.stdout)


def as_user(world: Any, who: str, live_server: Any, home: Path) -> Tau:
    token = tokens.issue_token(user=world.users[who], name="cli").plaintext
    return Tau(live_server.url, token, home)


def roles(world: Any) -> dict[str, str]:
    return {
        m.user.username: m.role
        for m in Membership.objects.for_workspace(world.alpha).select_related("user")
    }


def test_an_admin_manages_members_with_tau(world: Any, live_server: Any, tmp_path: Path) -> None:
    gamma = make_workspace("gamma")
    gus = get_user_model()._default_manager.create_user(
        username="gus", first_name="Gus", last_name="Grant"
    )
    Membership.objects.create(workspace=gamma, user=gus, role=Role.VIEWER)
    Membership.objects.create(workspace=gamma, user=world.users["workspace_admin"], role="viewer")
    tau = as_user(world, "workspace_admin", live_server, tmp_path / "alice")

    listed = tau.json("workspace", "members", "list")
    assert [(row["username"], row["role"]) for row in listed] == [
        ("alice", "admin"),
        ("rob", "researcher"),
        ("vera", "viewer"),
    ]
    table = tau("workspace", "members", "list")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0] == "Members of alpha"
    assert "rob" in table.stdout

    # The last admin: refused, in the portal's words, nothing changed (exit 2).
    stepped_down = tau("workspace", "members", "set-role", "alice", "researcher")
    assert (stepped_down.returncode, stepped_down.stderr) == (2, LAST_ADMIN)
    removed = tau("workspace", "members", "remove", "alice")
    assert (removed.returncode, removed.stderr) == (2, LAST_ADMIN)
    refused = tau("workspace", "members", "remove", "alice", "--json")
    assert json.loads(refused.stdout) == {
        "error": LAST_ADMIN.removeprefix("tau: ").strip(),
        "exit_code": 2,
        "details": {"detail": LAST_ADMIN.removeprefix("tau: ").strip()},
    }
    assert roles(world)["alice"] == "admin"

    added = tau("workspace", "members", "add", "gus", "--role", "viewer")
    assert (added.returncode, added.stdout) == (0, "Added gus to alpha as viewer.\n"), added.stderr
    twice = tau("workspace", "members", "add", "gus")
    assert (twice.returncode, twice.stderr) == (
        2,
        "tau: This user is already a member of this workspace.\n",
    )
    # otto exists (beta's admin) but shares no workspace with alice: the same answer as a
    # name nobody has.
    for name in ("otto", "nobody"):
        stranger = tau("workspace", "members", "add", name)
        assert stranger.returncode == 2
        assert stranger.stderr == (
            f"tau: username: No user called '{name}' that you can add. You can add people who "
            "already share a workspace with you; your platform team adds anyone else (or their "
            "identity-provider groups do).\n"
        )

    promoted = tau("workspace", "members", "set-role", "rob", "admin")
    assert promoted.stdout == "rob is now admin in alpha (was researcher).\n", promoted.stderr
    again = tau("workspace", "members", "set-role", "rob", "admin")
    assert again.stdout == "rob was already admin in alpha.\n"
    assert tau.json("workspace", "members", "set-role", "gus", "researcher")["role"] == (
        "researcher"
    )
    assert tau("workspace", "members", "set-role", "rob", "owner").returncode == 2

    gone = tau("workspace", "members", "remove", "vera")
    assert (gone.returncode, gone.stdout) == (0, "Removed vera from alpha.\n")
    missing = tau("workspace", "members", "remove", "vera")
    assert (missing.returncode, missing.stderr) == (
        4,
        "tau: not found: vera is not a member of this workspace.\n",
    )
    assert tau.json("workspace", "members", "remove", "gus") == {
        "workspace": "alpha",
        "username": "gus",
        "removed": True,
    }
    assert roles(world) == {"alice": "admin", "rob": "admin"}

    events = AuditEvent.objects.for_workspace(world.alpha).filter(
        object_type="workspaces.membership", source="api"
    )
    assert sorted((e.action, e.actor_username) for e in events) == [
        ("create", "alice"),
        ("delete", "alice"),
        ("delete", "alice"),
        ("update", "alice"),
        ("update", "alice"),
    ]

    # A member who is not an admin reads the list, and may change nothing (exit 3).
    vera = as_user(world, "viewer", live_server, tmp_path / "vera")
    assert vera("workspace", "members", "list").returncode == 4  # she is no member now
    researcher = Membership.objects.for_workspace(world.alpha).get(user__username="rob")
    researcher.role = Role.RESEARCHER
    researcher.save()
    rob = as_user(world, "researcher", live_server, tmp_path / "rob")
    assert [row["username"] for row in rob.json("workspace", "members", "list")] == [
        "alice",
        "rob",
    ]
    denied = rob("workspace", "members", "add", "vera")
    assert (denied.returncode, denied.stderr) == (
        3,
        "tau: not allowed: This needs the admin role in this workspace.\n",
    )


def test_what_tau_says_of_a_refused_run_a_missing_log_and_a_cancel(
    world: Any, live_server: Any, tmp_path: Path
) -> None:
    """No worker and no agent here: a submitted run stays pending, without a log."""
    local_quota(world.alpha)
    rob = as_user(world, "researcher", live_server, tmp_path / "rob")
    config = "examples/cpu-quickstart/tau.yaml"

    # The portal refuses what only it can check: its words once, each problem at its line.
    refused = rob("run", "--config", config, "--set", "queue.priority=urgent")
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.splitlines()
    assert lines[-1] == "tau: The run was not submitted."
    assert any(line.startswith(f"{config}:") and "queue.priority" in line for line in lines)
    assert "not submitted: The run was not submitted" not in refused.stderr
    as_json = rob("run", "--config", config, "--set", "queue.priority=urgent", "--json")
    answer = json.loads(as_json.stdout)
    assert (answer["error"], answer["exit_code"]) == ("The run was not submitted.", 2)
    assert answer["details"]["problems"][0]["file"] == config
    assert answer["details"]["problems"][0]["path"] == "queue.priority"

    run = rob.json("run", "--config", config, "--set", "name=cli-waiting")
    name = run["name"]
    assert run["state"] == "pending"
    logs = rob("logs", "cli-waiting")
    assert (logs.returncode, logs.stdout) == (0, "")
    assert logs.stderr.startswith(f"{name} has no log yet: it is pending (")
    assert logs.stderr.endswith(f"; `tau run logs {name} -f` waits for it.\n")
    cancelled = rob("cancel", "cli-waiting")
    assert (cancelled.returncode, cancelled.stdout) == (0, f"{name}: cancelled.\n")
    follow = rob("logs", "cli-waiting", "-f")
    assert follow.returncode == 1
    assert follow.stderr.splitlines()[-1].startswith(f"{name} cancelled — ")
