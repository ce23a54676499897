"""Quota rules follow Kueue's: what the platform team saves is what Kueue accepts."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from workspaces.models import ResourceFlavor, WorkspaceQuota

pytestmark = pytest.mark.django_db


def quota(world: Any, workspace: str = "beta", **fields: Any) -> WorkspaceQuota:
    values: dict[str, Any] = {
        "workspace": getattr(world, workspace),
        "flavor": world.gpu_flavor,
        "resource": "cpu",
        "nominal": Decimal(4),
    }
    values.update(fields)
    return WorkspaceQuota(**values)


def errors_of(instance: Any) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as caught:
        instance.full_clean()
    return caught.value.message_dict


def test_a_valid_quota_passes(world: Any) -> None:
    quota(world, resource="memory", nominal=Decimal(2**36)).full_clean()
    quota(
        world, workspace="alpha", borrowing_limit=Decimal(2), lending_limit=Decimal(1)
    ).full_clean()


def test_borrowing_limit_needs_a_cohort(world: Any) -> None:
    errors = errors_of(quota(world, borrowing_limit=Decimal(2)))
    assert errors["borrowing_limit"] == [
        "Borrowing needs a cohort: put the workspace in a cohort, or clear the limit."
    ]


def test_lending_limit_needs_a_cohort(world: Any) -> None:
    errors = errors_of(quota(world, lending_limit=Decimal(2)))
    assert "Lending needs a cohort" in errors["lending_limit"][0]


@pytest.mark.parametrize("field", ["nominal", "borrowing_limit", "lending_limit"])
def test_negative_amounts_are_refused(world: Any, field: str) -> None:
    errors = errors_of(quota(world, workspace="alpha", **{field: Decimal(-1)}))
    assert errors[field] == ["Must be zero or more."]


def test_lending_more_than_nominal_is_refused(world: Any) -> None:
    errors = errors_of(
        quota(world, workspace="alpha", nominal=Decimal(4), lending_limit=Decimal(5))
    )
    assert errors["lending_limit"] == ["Cannot lend more than the nominal quota (4)."]


def test_gpus_come_in_whole_units(world: Any) -> None:
    errors = errors_of(quota(world, resource="nvidia.com/gpu", nominal=Decimal("0.5")))
    assert errors["nominal"] == ["nvidia.com/gpu comes in whole units; use a whole number."]
    quota(world, resource="cpu", nominal=Decimal("0.5")).full_clean()


def test_duplicate_flavor_and_resource_rows_are_refused(world: Any) -> None:
    # alpha already has an nvidia.com/gpu row on h100 (see the world fixture).
    errors = errors_of(
        quota(world, workspace="alpha", resource="nvidia.com/gpu", nominal=Decimal(1))
    )
    assert errors["__all__"] == [
        "This workspace already has a quota for this resource on this flavor; "
        "edit that row instead of adding another."
    ]


def test_resource_names_are_checked(world: Any) -> None:
    errors = errors_of(quota(world, resource="GPU!!"))
    assert "is not a resource name" in errors["resource"][0]


def test_leaving_a_cohort_with_limits_is_refused(world: Any) -> None:
    quota(world, workspace="alpha", resource="cpu", borrowing_limit=Decimal(2)).save()
    world.alpha.cohort = None
    with pytest.raises(ValidationError) as caught:
        world.alpha.full_clean()
    assert "clear those limits before removing the cohort" in caught.value.message_dict["cohort"][0]


def test_flavor_labels_and_tolerations_are_checked() -> None:
    flavor = ResourceFlavor(
        name="a100",
        node_labels={"bad key!": "x", "pool": "not ok value!"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Sometimes", "effect": "Never"}],
    )
    with pytest.raises(ValidationError) as caught:
        flavor.full_clean()
    errors = caught.value.message_dict
    assert any("Label key 'bad key!'" in message for message in errors["node_labels"])
    assert any("value 'not ok value!'" in message for message in errors["node_labels"])
    assert "operator must be Equal or Exists" in " ".join(errors["tolerations"])
    assert "effect must be one of" in " ".join(errors["tolerations"])


def test_default_priority_must_be_allowed(world: Any) -> None:
    world.alpha.default_priority = "urgent"
    with pytest.raises(ValidationError) as caught:
        world.alpha.full_clean()
    assert (
        "'urgent' is not one of the allowed priorities"
        in caught.value.message_dict["default_priority"][0]
    )
