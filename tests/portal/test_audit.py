"""Every change to workspaces, members, quotas, flavors and cohorts leaves exactly one audit
event with the right before/after, whether made in the admin or through the API; the log
itself cannot be changed."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.utils import DatabaseError
from django.urls import reverse

from portal import audit
from portal.audit import FieldChange, describe_changes
from portal.models import AuditEvent, AuditLogIsAppendOnly
from tau.quantity import parse_quantity
from workspaces.models import Cohort, Membership, ResourceFlavor, Workspace, WorkspaceQuota

pytestmark = pytest.mark.django_db


def events() -> list[Any]:
    return list(AuditEvent.objects.unscoped().order_by("id"))


def inline_management(prefix: str, total: int, initial: int = 0) -> dict[str, str]:
    return {
        f"{prefix}-TOTAL_FORMS": str(total),
        f"{prefix}-INITIAL_FORMS": str(initial),
        f"{prefix}-MIN_NUM_FORMS": "0",
        f"{prefix}-MAX_NUM_FORMS": "1000",
    }


def workspace_form(**overrides: str) -> dict[str, str]:
    data = {
        "slug": "gamma",
        "name": "Gamma",
        "description": "",
        "active": "on",
        "namespace": "tau-gamma",
        "local_queue": "gamma",
        "cohort": "",
        "default_image": "",
        # allowed_priorities: checkboxes, none chosen, send nothing.
        "default_priority": "",
    }
    data.update(overrides)
    return data


def test_admin_creates_workspace_with_members_and_quota(world: Any) -> None:
    client = world.client_for("platform_admin")
    before = AuditEvent.objects.unscoped().count()
    data = workspace_form()
    data.update(inline_management("memberships", 1))
    data.update(
        {"memberships-0-user": str(world.users["researcher"].pk), "memberships-0-role": "admin"}
    )
    data.update(inline_management("quotas", 1))
    data.update(
        {
            "quotas-0-flavor": str(world.gpu_flavor.pk),
            "quotas-0-resource": "nvidia.com/gpu",
            "quotas-0-nominal": "4",
            "quotas-0-borrowing_limit": "",
            "quotas-0-lending_limit": "",
        }
    )
    data.update(inline_management("budgets", 0))
    response = client.post(reverse("admin:workspaces_workspace_add"), data)
    assert response.status_code == 302, response.content.decode()[:2000]
    gamma = Workspace.unscoped_objects.get(slug="gamma")
    new = events()[before:]
    assert [(e.action, e.object_type) for e in new] == [
        ("create", "workspaces.workspace"),
        ("create", "workspaces.membership"),
        ("create", "workspaces.workspacequota"),
    ]
    for event in new:
        assert event.actor_username == "platform"
        assert event.source == "admin"
        assert event.workspace_id == gamma.pk
        assert event.workspace_slug == "gamma"
        assert event.before is None
        assert event.request_id
        assert event.remote_addr == "127.0.0.1"
    assert new[0].after["slug"] == "gamma"
    assert new[0].after["namespace"] == "tau-gamma"
    assert new[1].after == {
        "id": new[1].after["id"],
        "workspace": gamma.pk,
        "user": world.users["researcher"].pk,
        "role": "admin",
        "source": "manual",
        "created_at": new[1].after["created_at"],
    }
    assert new[2].after["resource"] == "nvidia.com/gpu"
    assert new[2].after["nominal"] == "4"  # as typed: a Kubernetes quantity


def test_admin_change_records_only_what_changed(world: Any) -> None:
    client = world.client_for("platform_admin")
    alpha = world.alpha
    memberships = list(Membership.objects.for_workspace(alpha).order_by("pk"))
    quotas = list(WorkspaceQuota.objects.for_workspace(alpha).order_by("pk"))
    data = workspace_form(
        slug="alpha",
        name="Alpha Team",  # the only change
        namespace=alpha.namespace,
        local_queue=alpha.local_queue,
        cohort=str(world.cohort.pk),
        allowed_priorities="normal",  # its checkbox
    )
    data.update(inline_management("memberships", len(memberships), len(memberships)))
    for index, membership in enumerate(memberships):
        data.update(
            {
                f"memberships-{index}-id": str(membership.pk),
                f"memberships-{index}-workspace": str(alpha.pk),
                f"memberships-{index}-user": str(membership.user_id),
                f"memberships-{index}-role": membership.role,
            }
        )
    data.update(inline_management("quotas", len(quotas), len(quotas)))
    for index, quota in enumerate(quotas):
        data.update(
            {
                f"quotas-{index}-id": str(quota.pk),
                f"quotas-{index}-workspace": str(alpha.pk),
                f"quotas-{index}-flavor": str(quota.flavor_id),
                f"quotas-{index}-resource": quota.resource,
                f"quotas-{index}-nominal": "8",
                f"quotas-{index}-borrowing_limit": "",
                f"quotas-{index}-lending_limit": "",
            }
        )
    data.update(inline_management("budgets", 0))
    before = AuditEvent.objects.unscoped().count()
    response = client.post(reverse("admin:workspaces_workspace_change", args=[alpha.pk]), data)
    assert response.status_code == 302, response.content.decode()[:3000]
    new = events()[before:]
    assert len(new) == 1
    event = new[0]
    assert (event.action, event.object_type, event.object_id) == (
        "update",
        "workspaces.workspace",
        str(alpha.pk),
    )
    assert event.before == {"name": "Alpha"}
    assert event.after == {"name": "Alpha Team"}


def test_admin_delete_records_each_deleted_row(world: Any) -> None:
    client = world.client_for("platform_admin")
    beta = world.beta
    before = AuditEvent.objects.unscoped().count()
    response = client.post(
        reverse("admin:workspaces_workspace_delete", args=[beta.pk]), {"post": "yes"}
    )
    assert response.status_code == 302
    new = events()[before:]
    assert sorted((e.action, e.object_type) for e in new) == [
        ("delete", "workspaces.membership"),
        ("delete", "workspaces.workspace"),
        ("delete", "workspaces.workspacequota"),
    ]
    # The records outlive the workspace and still say which one it was.
    assert {e.workspace_slug for e in new} == {"beta"}
    workspace_event = next(e for e in new if e.object_type == "workspaces.workspace")
    assert workspace_event.before["slug"] == "beta"
    assert workspace_event.after is None
    membership_event = next(e for e in new if e.object_type == "workspaces.membership")
    assert membership_event.object_repr == "otto in beta (admin)"


@pytest.mark.parametrize(
    ("url_name", "model", "data", "expected_after"),
    [
        (
            "admin:workspaces_resourceflavor_add",
            ResourceFlavor,
            {
                "name": "a100",
                "gpu_model": "NVIDIA-A100",
                "node_labels": "{}",
                "tolerations": "[]",
                "description": "",
            },
            {"name": "a100", "gpu_model": "NVIDIA-A100"},
        ),
        (
            "admin:workspaces_cohort_add",
            Cohort,
            {"name": "vision", "description": "Vision teams"},
            {"name": "vision", "description": "Vision teams"},
        ),
    ],
)
def test_platform_objects_are_audited(
    world: Any,
    url_name: str,
    model: type[Any],
    data: dict[str, str],
    expected_after: dict[str, str],
) -> None:
    client = world.client_for("platform_admin")
    before = AuditEvent.objects.unscoped().count()
    response = client.post(reverse(url_name), data)
    assert response.status_code == 302, response.content.decode()[:2000]
    new = events()[before:]
    assert len(new) == 1
    assert new[0].action == "create"
    assert new[0].object_type == f"workspaces.{model._meta.model_name}"
    assert new[0].workspace_id is None
    for key, value in expected_after.items():
        assert new[0].after[key] == value


def test_saving_without_changes_records_nothing(world: Any) -> None:
    before = AuditEvent.objects.unscoped().count()
    world.alpha.save()
    assert AuditEvent.objects.unscoped().count() == before


def test_api_member_changes_are_audited_with_the_api_caller(world: Any) -> None:
    # An admin adds only people who share a workspace with them: alice joins beta, otto's.
    Membership.objects.create(workspace=world.beta, user=world.users["workspace_admin"])
    client = world.api_client_for("workspace_admin")
    before = AuditEvent.objects.unscoped().count()
    url = reverse("api:member-list", kwargs={"workspace_slug": "alpha"})
    assert (
        client.post(url, {"username": "otto", "role": "viewer"}, format="json").status_code == 201
    )
    detail = reverse("api:member-detail", kwargs={"workspace_slug": "alpha", "username": "otto"})
    assert client.patch(detail, {"role": "researcher"}, format="json").status_code == 200
    assert client.delete(detail).status_code == 204
    new = events()[before:]
    assert [e.action for e in new] == ["create", "update", "delete"]
    assert {e.actor_username for e in new} == {"alice"}
    assert {e.source for e in new} == {"api"}
    assert {e.workspace_slug for e in new} == {"alpha"}
    assert new[1].before == {"role": "viewer"}
    assert new[1].after == {"role": "researcher"}


def test_audit_events_cannot_be_changed_by_the_application(world: Any) -> None:
    event = AuditEvent.objects.unscoped().first()
    assert event is not None
    event.action = "tampered"
    with pytest.raises(AuditLogIsAppendOnly):
        event.save()
    with pytest.raises(AuditLogIsAppendOnly):
        event.delete()
    with pytest.raises(AuditLogIsAppendOnly):
        AuditEvent.objects.unscoped().update(action="tampered")
    with pytest.raises(AuditLogIsAppendOnly):
        AuditEvent.objects.unscoped().delete()


@pytest.mark.parametrize(
    "statement", ["UPDATE portal_auditevent SET action = 'x'", "DELETE FROM portal_auditevent"]
)
def test_audit_table_refuses_changes_in_the_database(world: Any, statement: str) -> None:
    assert AuditEvent.objects.unscoped().exists()
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement)
    assert not AuditEvent.objects.unscoped().filter(action="x").exists()


def test_admin_offers_no_way_to_change_audit_events(world: Any) -> None:
    client = world.client_for("platform_admin")
    event = AuditEvent.objects.unscoped().first()
    assert event is not None
    change_url = reverse("admin:portal_auditevent_change", args=[event.pk])
    page = client.get(change_url)
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert client.post(change_url, {"action": "tampered"}).status_code == 403
    assert (
        client.post(
            reverse("admin:portal_auditevent_delete", args=[event.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    assert AuditEvent.objects.unscoped().filter(action="tampered").count() == 0


def quota_events(quota: WorkspaceQuota) -> list[Any]:
    return list(
        AuditEvent.objects.unscoped()
        .filter(object_type="workspaces.workspacequota", object_id=str(quota.pk))
        .order_by("id")
    )


@pytest.mark.parametrize(
    ("resource", "typed", "changed_to"),
    [
        ("memory", "512Mi", "4Gi"),
        ("memory", "64Gi", "1Ti"),
        ("cpu", "500m", "16"),
        ("nvidia.com/gpu", "8", "4"),
    ],
)
def test_quota_amounts_are_recorded_as_typed(
    world: Any, resource: str, typed: str, changed_to: str
) -> None:
    quota = WorkspaceQuota.objects.create(
        workspace=world.beta,
        flavor=ResourceFlavor.objects.create(name="spare"),
        resource=resource,
        nominal=parse_quantity(typed),
    )
    quota.nominal = parse_quantity(changed_to)
    quota.save()
    created, updated = quota_events(quota)
    assert created.after["nominal"] == typed
    assert created.after["borrowing_limit"] is None
    assert updated.before == {"nominal": typed}
    assert updated.after == {"nominal": changed_to}


def test_an_amount_saved_unchanged_is_not_a_change(world: Any) -> None:
    quota = WorkspaceQuota.objects.for_workspace(world.alpha).get()
    before = AuditEvent.objects.unscoped().count()
    quota.nominal = 8  # an int where the database gave Decimal("8.000"): the same amount
    quota.save()
    assert AuditEvent.objects.unscoped().count() == before


def recorded(**fields: Any) -> AuditEvent:
    with audit.acting_as(None, source="system"):
        event = audit.record(**fields)
    assert isinstance(event, AuditEvent)
    return event


def test_an_update_reads_as_the_fields_that_changed_old_to_new(world: Any) -> None:
    quota = WorkspaceQuota.objects.create(
        workspace=world.beta, flavor=world.gpu_flavor, resource="memory", nominal=Decimal(2**32)
    )
    quota.nominal = Decimal(2**33)
    quota.save()
    workspace = world.beta
    workspace.name = "Beta Team"
    workspace.active = False
    workspace.save()
    quota_update = quota_events(quota)[-1]
    assert describe_changes(quota_update) == [FieldChange("nominal", "4Gi", "8Gi")]
    workspace_update = AuditEvent.objects.unscoped().filter(action="update").latest("id")
    assert describe_changes(workspace_update) == [
        FieldChange("name", "Beta", "Beta Team"),
        FieldChange("active", "yes", "no"),
    ]
    assert FieldChange("name", "Beta", "Beta Team").text == "Beta → Beta Team"


def test_rows_recorded_before_quantities_still_read_well(world: Any) -> None:
    # The shape rows had before quantities were recorded as quantities; they stay as they
    # are (the log is append-only) and read the way the admin form shows the amount.
    update = recorded(
        action="update",
        object_type="workspaces.workspacequota",
        before={"nominal": "4294967296.000", "lending_limit": None},
        after={"nominal": "8589934592.000", "lending_limit": "0.500"},
    )
    assert describe_changes(update) == [
        FieldChange("nominal", "4Gi", "8Gi"),
        FieldChange("lending_limit", "—", "500m"),
    ]
    created = recorded(
        action="create",
        object_type="workspaces.workspacequota",
        after={
            "id": 7,
            "workspace": 3,
            "flavor": 1,
            "resource": "nvidia.com/gpu",
            "nominal": "4.000",
            "borrowing_limit": None,
            "lending_limit": None,
        },
    )
    # Empty fields are left out of a create; the rest in the model's order.
    assert describe_changes(created) == [
        FieldChange("id", None, "7"),
        FieldChange("workspace", None, "3"),
        FieldChange("flavor", None, "1"),
        FieldChange("resource", None, "nvidia.com/gpu"),
        FieldChange("nominal", None, "4"),
    ]
    assert FieldChange("nominal", None, "4").text == "4"


def test_events_that_are_not_model_changes_read_too(world: Any) -> None:
    role_change = recorded(
        action="user.role_change",
        object_type="auth.user",
        before={"is_staff": False},
        after={"is_staff": True},
    )
    assert describe_changes(role_change) == [FieldChange("is_staff", "no", "yes")]
    token = recorded(
        action="token.create",
        object_type="portal.apitoken",
        after={"name": "ci", "workspace": None, "scopes": ["read"]},
    )
    assert describe_changes(token) == [
        FieldChange("name", None, "ci"),
        FieldChange("scopes", None, '["read"]'),
    ]
    assert describe_changes(recorded(action="login.failed", object_type="oidc")) == []


def test_admin_shows_the_change_readably(world: Any) -> None:
    legacy = recorded(
        action="update",
        workspace=world.alpha,
        object_type="workspaces.workspacequota",
        object_repr="alpha: 4Gi memory on h100",
        before={"nominal": "4294967296.000"},
        after={"nominal": "8589934592.000"},
    )
    client = world.client_for("platform_admin")
    page = client.get(reverse("admin:portal_auditevent_change", args=[legacy.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert "<pre>nominal: 4Gi → 8Gi</pre>" in html
    # The stored JSON is still there, exactly as recorded, for whoever needs it.
    assert "4294967296.000" in html
    listing = client.get(reverse("admin:portal_auditevent_changelist")).content.decode()
    assert '<td class="field-changed_fields">nominal</td>' in listing
