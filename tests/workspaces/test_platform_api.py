"""The platform API for staff (issue 13): workspaces with members and quotas, quotas replaced
as a list, flavors and cohorts — the admin's rules, audited, all or nothing; nobody else."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from rest_framework.test import APIClient

from identity import tokens
from portal.models import AuditEvent
from workspaces.models import Cohort, Membership, ResourceFlavor, Role, Workspace, WorkspaceQuota

pytestmark = pytest.mark.django_db

API = "/api/v1"


def with_token(world: Any, who: str, **options: Any) -> APIClient:
    """A client that authenticates as a script would: with a real API token."""
    issued = tokens.issue_token(user=world.users[who], name="platform script", **options)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.plaintext}")
    return client


def gamma(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "slug": "gamma",
        "name": "Gamma lab",
        "cohort": "research",
        "allowed_priorities": ["normal"],
        "members": [
            {"username": "alice", "role": "admin"},
            {"username": "rob", "role": "researcher"},
        ],
        "quotas": [
            {"flavor": "h100", "resource": "nvidia.com/gpu", "nominal": 8, "lending_limit": "4"},
            {"flavor": "h100", "resource": "memory", "nominal": "512Gi"},
        ],
    }
    body.update(extra)
    return body


def quotas_of(slug: str) -> dict[tuple[str, str], tuple[Any, ...]]:
    workspace = Workspace.unscoped_objects.get(slug=slug)
    return {
        (q.flavor.name, q.resource): (q.nominal, q.borrowing_limit, q.lending_limit)
        for q in WorkspaceQuota.objects.for_workspace(workspace).select_related("flavor")
    }


def test_staff_create_a_workspace_with_members_and_quotas_audited(world: Any) -> None:
    response = with_token(world, "platform_admin").post(
        f"{API}/workspaces/", gamma(), format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["slug"], body["namespace"], body["local_queue"]) == ("gamma", "tau-gamma", "gamma")
    assert body["cohort"] == "research"
    assert body["gpu_quota"] == 8
    assert {(q["resource"], q["nominal"], q["lending_limit"]) for q in body["quotas"]} == {
        ("nvidia.com/gpu", "8", "4"),
        ("memory", "512Gi", None),
    }
    workspace = Workspace.unscoped_objects.get(slug="gamma")
    roles = {
        m.user.get_username(): m.role
        for m in Membership.objects.for_workspace(workspace).select_related("user")
    }
    assert roles == {"alice": Role.ADMIN, "rob": Role.RESEARCHER}
    assert quotas_of("gamma")[("h100", "memory")][0] == Decimal(512 * 2**30)
    events = AuditEvent.objects.for_workspace(workspace)
    created = {(e.action, e.object_type) for e in events}
    assert ("create", "workspaces.workspace") in created
    assert ("create", "workspaces.workspacequota") in created
    assert ("create", "workspaces.membership") in created
    assert {e.actor_username for e in events} == {"platform"}


@pytest.mark.parametrize(
    ("who", "options"),
    [
        ("researcher", {}),
        ("workspace_admin", {}),
        ("platform_admin", {"read_only": True}),
        ("platform_admin", {"workspace": "alpha"}),
    ],
)
def test_only_staff_with_a_platform_token_may_create(world: Any, who: str, options: Any) -> None:
    if options.get("workspace"):
        options = {**options, "workspace": world.alpha}
    response = with_token(world, who, **options).post(f"{API}/workspaces/", gamma(), format="json")
    assert response.status_code == 403, response.content
    assert not Workspace.unscoped_objects.filter(slug="gamma").exists()


@pytest.mark.parametrize(
    ("change", "where", "words"),
    [
        ({"slug": "Not A Slug"}, ["slug"], "letters"),
        ({"slug": "alpha"}, ["slug"], "already exists"),
        ({"cohort": "nowhere"}, ["cohort"], "No cohort named 'nowhere'"),
        (
            {"quotas": [{"flavor": "a100", "resource": "nvidia.com/gpu", "nominal": "1"}]},
            ["quotas", 0, "flavor"],
            "No flavor named 'a100' (there are: h100)",
        ),
        (
            {
                "quotas": [
                    {"flavor": "h100", "resource": "cpu", "nominal": "1"},
                    {"flavor": "h100", "resource": "cpu", "nominal": "2"},
                ]
            },
            ["quotas", 1, "resource"],
            "given twice",
        ),
        (
            {"quotas": [{"flavor": "h100", "resource": "nvidia.com/gpu", "nominal": "0.5"}]},
            ["quotas", 0, "nominal"],
            "whole units",
        ),
        (
            {
                "quotas": [
                    {
                        "flavor": "h100",
                        "resource": "nvidia.com/gpu",
                        "nominal": "2",
                        "lending_limit": "3",
                    }
                ]
            },
            ["quotas", 0, "lending_limit"],
            "Cannot lend more than the nominal quota (2)",
        ),
        (
            {
                "cohort": None,
                "quotas": [
                    {
                        "flavor": "h100",
                        "resource": "cpu",
                        "nominal": "2",
                        "borrowing_limit": "2",
                    }
                ],
            },
            ["quotas", 0, "borrowing_limit"],
            "Borrowing needs a cohort",
        ),
        (
            {"members": [{"username": "nobody", "role": "admin"}]},
            ["members", 0, "username"],
            "No user",
        ),
        (
            {"members": [{"username": "rob", "role": "viewer"}]},
            ["members", 0],
            "at least one admin",
        ),
        # Issue 30: a workspace without an admin, in the cluster's or the portal's namespace.
        ({"members": []}, ["members", 0], "at least one admin"),
        ({"namespace": "kube-system"}, ["namespace"], "a namespace of the cluster"),
        ({"namespace": "kube-public"}, ["namespace"], "matches 'kube-*'"),
        ({"namespace": "default"}, ["namespace"], "a namespace of the cluster"),
        ({"namespace": "taugrid"}, ["namespace"], "the namespace TauGrid itself runs in"),
        ({"default_priority": "urgent"}, ["default_priority"], "not one of the allowed"),
        (
            {"quotas": [{"flavor": "h100", "resource": "memory", "nominal": "lots"}]},
            ["quotas", 0, "nominal"],
            "'lots' is not a Kubernetes quantity",
        ),
    ],
)
def test_a_wrong_workspace_is_refused_where_it_is_wrong_and_nothing_is_written(
    world: Any, change: dict[str, Any], where: list[Any], words: str
) -> None:
    client = with_token(world, "platform_admin")
    before = (Workspace.unscoped_objects.count(), AuditEvent.objects.unscoped().count())
    response = client.post(f"{API}/workspaces/", gamma(**change), format="json")
    assert response.status_code == 400, response.content
    said: Any = response.json()
    for step in where:
        said = said[step]
    assert words in " ".join(said if isinstance(said, list) else [str(said)]), response.json()
    assert (Workspace.unscoped_objects.count(), AuditEvent.objects.unscoped().count()) == before


def test_quotas_are_replaced_as_a_list_and_unchanged_rows_are_not_rewritten(world: Any) -> None:
    client = with_token(world, "platform_admin")
    assert client.post(f"{API}/workspaces/", gamma(), format="json").status_code == 201
    workspace = Workspace.unscoped_objects.get(slug="gamma")
    events_before = AuditEvent.objects.for_workspace(workspace).count()
    quotas = [
        {"flavor": "h100", "resource": "nvidia.com/gpu", "nominal": "8", "lending_limit": "4"},
        {"flavor": "h100", "resource": "cpu", "nominal": "96"},
    ]
    response = client.patch(f"{API}/workspaces/gamma/", {"quotas": quotas}, format="json")
    assert response.status_code == 200, response.content
    assert quotas_of("gamma") == {
        ("h100", "nvidia.com/gpu"): (Decimal(8), None, Decimal(4)),
        ("h100", "cpu"): (Decimal(96), None, None),
    }
    new_events = AuditEvent.objects.for_workspace(workspace).order_by("id")[events_before:]
    # memory removed, cpu added; the GPU row, given as it was, untouched.
    assert sorted((e.action, e.object_repr.split(" ")[-3]) for e in new_events) == [
        ("create", "cpu"),
        ("delete", "memory"),
    ]


def test_leaving_a_cohort_works_when_the_same_request_drops_the_limits(world: Any) -> None:
    client = with_token(world, "platform_admin")
    assert client.post(f"{API}/workspaces/", gamma(), format="json").status_code == 201
    refused = client.patch(f"{API}/workspaces/gamma/", {"cohort": None}, format="json")
    assert refused.status_code == 400
    assert "clear those limits" in refused.json()["cohort"][0]
    assert Workspace.unscoped_objects.get(slug="gamma").cohort_id == world.cohort.pk
    assert quotas_of("gamma")[("h100", "nvidia.com/gpu")][2] == Decimal(4)

    quotas = [{"flavor": "h100", "resource": "nvidia.com/gpu", "nominal": "8"}]
    moved = client.patch(
        f"{API}/workspaces/gamma/", {"cohort": None, "quotas": quotas}, format="json"
    )
    assert moved.status_code == 200, moved.content
    assert moved.json()["cohort"] is None
    assert quotas_of("gamma") == {("h100", "nvidia.com/gpu"): (Decimal(8), None, None)}


def test_a_refused_quota_change_leaves_every_row_as_it_was(world: Any) -> None:
    client = with_token(world, "platform_admin")
    before = quotas_of("alpha")
    quotas = [
        {"flavor": "h100", "resource": "cpu", "nominal": "4"},
        {"flavor": "h100", "resource": "nvidia.com/gpu", "nominal": "-1"},
    ]
    response = client.patch(f"{API}/workspaces/alpha/", {"quotas": quotas}, format="json")
    assert response.status_code == 400
    assert response.json()["quotas"][0] == {}
    assert "zero or more" in response.json()["quotas"][1]["nominal"][0]
    assert quotas_of("alpha") == before


def test_workspace_admins_change_their_details_but_not_the_platform_part(world: Any) -> None:
    client = with_token(world, "workspace_admin")
    assert (
        client.patch(f"{API}/workspaces/alpha/", {"description": "ok"}, format="json").status_code
        == 200
    )
    quotas = [{"flavor": "h100", "resource": "nvidia.com/gpu", "nominal": "64"}]
    response = client.patch(f"{API}/workspaces/alpha/", {"quotas": quotas}, format="json")
    assert response.status_code == 403
    assert "Only platform staff change quotas" in response.json()["detail"]
    assert quotas_of("alpha")[("h100", "nvidia.com/gpu")][0] == Decimal(8)
    researcher = with_token(world, "researcher")
    assert (
        researcher.patch(
            f"{API}/workspaces/alpha/", {"description": "x"}, format="json"
        ).status_code
        == 403
    )


def test_flavors_and_cohorts_through_the_api_with_the_admins_checks(world: Any) -> None:
    client = with_token(world, "platform_admin")
    flavor = {
        "name": "a100",
        "gpu_model": "NVIDIA-A100-SXM4-80GB",
        "node_labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    created = client.post(f"{API}/flavors/", flavor, format="json")
    assert created.status_code == 201, created.content
    assert ResourceFlavor.objects.get(name="a100").tolerations == flavor["tolerations"]
    assert [f["name"] for f in client.get(f"{API}/flavors/").json()] == ["a100", "h100"]
    twice = client.post(f"{API}/flavors/", flavor, format="json")
    assert twice.status_code == 400
    assert "already exists" in twice.json()["name"][0]
    bad = client.patch(f"{API}/flavors/a100/", {"node_labels": {"bad key!": "x"}}, format="json")
    assert bad.status_code == 400
    assert "Label key 'bad key!'" in bad.json()["node_labels"][0]
    changed = client.patch(f"{API}/flavors/a100/", {"description": "Lab B"}, format="json")
    assert changed.status_code == 200
    assert (
        AuditEvent.objects.unscoped()
        .filter(action="update", object_type="workspaces.resourceflavor", object_repr="a100")
        .exists()
    )

    assert client.post(f"{API}/cohorts/", {"name": "vision"}, format="json").status_code == 201
    assert Cohort.objects.filter(name="vision").exists()
    for who in ("researcher", "workspace_admin"):
        other = with_token(world, who)
        assert other.get(f"{API}/flavors/").status_code == 403
        assert other.post(f"{API}/cohorts/", {"name": "mine"}, format="json").status_code == 403
        assert (
            other.patch(f"{API}/flavors/h100/", {"description": "x"}, format="json").status_code
            == 403
        )
    assert not Cohort.objects.filter(name="mine").exists()
    read_only = with_token(world, "platform_admin", read_only=True)
    assert read_only.get(f"{API}/flavors/").status_code == 200
    assert read_only.post(f"{API}/cohorts/", {"name": "ro"}, format="json").status_code == 403
    assert (
        read_only.patch(f"{API}/flavors/h100/", {"description": "x"}, format="json").status_code
        == 403
    )


def test_cohorts_nest_through_the_api_and_a_circle_is_refused(world: Any) -> None:
    client = with_token(world, "platform_admin")
    made = client.post(f"{API}/cohorts/", {"name": "lab-a", "parent": "research"}, format="json")
    assert made.status_code == 201, made.content
    assert made.json() == {"name": "lab-a", "parent": "research", "description": ""}
    assert Cohort.objects.get(name="lab-a").parent == world.cohort
    circle = client.patch(f"{API}/cohorts/research/", {"parent": "lab-a"}, format="json")
    assert circle.status_code == 400
    assert "cannot be inside itself" in circle.json()["parent"][0]
    assert Cohort.objects.get(name="research").parent is None
    unknown = client.post(f"{API}/cohorts/", {"name": "lab-b", "parent": "nowhere"}, format="json")
    assert unknown.status_code == 400
    assert "parent" in unknown.json()


def test_a_workspace_without_members_is_refused(world: Any) -> None:
    body = gamma()
    del body["members"]
    response = with_token(world, "platform_admin").post(f"{API}/workspaces/", body, format="json")
    assert response.status_code == 400
    assert response.json()["members"] == [
        "A workspace needs an admin: name at least one admin among its members."
    ]
    assert not Workspace.unscoped_objects.filter(slug="gamma").exists()


def test_the_portals_own_namespace_is_refused_wherever_it_runs(world: Any, settings: Any) -> None:
    settings.TAU_KUBE_WATCHER_LEASE_NAMESPACE = "platform-taugrid"
    response = with_token(world, "platform_admin").post(
        f"{API}/workspaces/", gamma(namespace="platform-taugrid"), format="json"
    )
    assert response.status_code == 400
    assert "TauGrid itself runs in" in response.json()["namespace"][0]


def test_the_deny_list_is_the_platform_teams(world: Any, settings: Any) -> None:
    settings.TAU_WORKSPACE_NAMESPACES_DENIED = ["shared-*"]
    client = with_token(world, "platform_admin")
    refused = client.post(f"{API}/workspaces/", gamma(namespace="shared-ml"), format="json")
    assert refused.status_code == 400
    assert "TAU_WORKSPACE_NAMESPACES_DENIED" in refused.json()["namespace"][0]
    assert (
        client.post(f"{API}/workspaces/", gamma(namespace="ml-gamma"), format="json").status_code
        == 201
    )


def test_a_workspace_cannot_be_moved_into_a_system_namespace(world: Any) -> None:
    client = with_token(world, "platform_admin")
    response = client.patch(f"{API}/workspaces/alpha/", {"namespace": "kube-system"}, format="json")
    assert response.status_code == 400
    assert "a namespace of the cluster" in response.json()["namespace"][0]
    world.alpha.refresh_from_db()
    assert world.alpha.namespace == "tau-alpha"


def test_a_workspace_already_in_a_denied_namespace_keeps_working(world: Any) -> None:
    """Made before the rule (or by hand): other changes are still saved; moving it is the
    platform team's decision."""
    Workspace.unscoped_objects.filter(pk=world.alpha.pk).update(namespace="default")
    client = with_token(world, "platform_admin")
    response = client.patch(f"{API}/workspaces/alpha/", {"name": "Alpha lab"}, format="json")
    assert response.status_code == 200, response.content
    world.alpha.refresh_from_db()
    assert (world.alpha.name, world.alpha.namespace) == ("Alpha lab", "default")
