"""Workspaces, flavors and cohorts as platform staff create and change them through the API
(for teams that keep their platform in Git).

The rules are the admin's: every row goes through its model's ``full_clean``, the audit is
written by the models themselves, and whatever keeps Kueue in step hooks the same saves. A
request is written whole or not at all: all its problems are collected first, each at the
place it was given (``quotas[1].nominal``), and nothing is saved when there is one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.contrib.auth import get_user_model
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import transaction

from workspaces.fields import QuantityFormField
from workspaces.models import (
    Cohort,
    Membership,
    ResourceFlavor,
    Role,
    Workspace,
    WorkspaceQuota,
)

#: Workspace fields staff may set through the API, besides ``cohort``, members and quotas.
WORKSPACE_FIELDS = (
    "name",
    "description",
    "namespace",
    "local_queue",
    "default_image",
    "allowed_priorities",
    "default_priority",
)
FLAVOR_FIELDS = ("name", "gpu_model", "node_labels", "tolerations", "description")
COHORT_FIELDS = ("name", "parent", "description")


class Refused(Exception):
    """What was wrong, by where it was given: ``{"slug": [...], "quotas": [{}, {...}]}``
    (a list has one entry per item, empty for an item without problems)."""

    def __init__(self, problems: dict[str, Any]) -> None:
        super().__init__(problems)
        self.problems = problems


@dataclass(frozen=True)
class QuotaRow:
    flavor: str
    resource: str
    nominal: Any
    borrowing_limit: Any = None
    lending_limit: Any = None


@dataclass(frozen=True)
class MemberRow:
    username: str
    role: str = Role.RESEARCHER


def _messages(error: ValidationError) -> dict[str, list[str]]:
    if hasattr(error, "error_dict"):
        return {
            ("detail" if field == NON_FIELD_ERRORS else field): list(messages)
            for field, messages in error.message_dict.items()
        }
    return {"detail": list(error.messages)}


def _checked(instance: Any, *, exclude: Sequence[str] = ()) -> dict[str, list[str]]:
    """The instance's problems as its admin form would show them (none: empty)."""
    try:
        instance.full_clean(exclude=list(exclude))
    except ValidationError as error:
        return _messages(error)
    return {}


def _cohort(name: str | None, problems: dict[str, Any]) -> Cohort | None:
    if not name:
        return None
    cohort = Cohort.objects.filter(name=name).first()
    if cohort is None:
        problems["cohort"] = [f"No cohort named {name!r}; create it first (POST /api/v1/cohorts/)."]
    return cohort


def _quota_rows(
    workspace: Workspace, rows: Sequence[QuotaRow], problems: dict[str, Any]
) -> tuple[list[WorkspaceQuota], list[WorkspaceQuota]]:
    """The rows to save (new or changed) and those to delete to replace the workspace's
    quotas with ``rows``; problems under ``quotas``."""
    flavors = {flavor.name: flavor for flavor in ResourceFlavor.objects.all()}
    existing = (
        {(q.flavor.name, q.resource): q for q in WorkspaceQuota.objects.for_workspace(workspace)}
        if workspace.pk
        else {}
    )
    keep: list[WorkspaceQuota] = []
    amounts = ("nominal", "borrowing_limit", "lending_limit")
    seen: set[tuple[str, str]] = set()
    found: list[dict[str, list[str]]] = []
    for row in rows:
        said: dict[str, list[str]] = {}
        flavor = flavors.get(row.flavor)
        if flavor is None:
            known = ", ".join(sorted(flavors)) or "none yet"
            said["flavor"] = [f"No flavor named {row.flavor!r} (there are: {known})."]
        elif (row.flavor, row.resource) in seen:
            said["resource"] = [
                f"{row.resource} on {row.flavor} is given twice; give each flavor and resource "
                "once."
            ]
        else:
            seen.add((row.flavor, row.resource))
            quota = existing.get((row.flavor, row.resource)) or WorkspaceQuota(
                workspace=workspace, flavor=flavor, resource=row.resource
            )
            before = [getattr(quota, name) for name in amounts]
            quota.workspace = workspace  # the in-memory one: its cohort as given
            unreadable = {}
            for name in amounts:
                # Read as the admin's form reads them: "8", "500m", "512Gi".
                form_field = QuantityFormField(required=name == "nominal")
                try:
                    setattr(quota, name, form_field.clean(getattr(row, name)))
                except ValidationError as error:
                    unreadable[name] = list(error.messages)
                    setattr(quota, name, None)
            # The workspace may not be saved yet; uniqueness is checked above.
            said = {**_checked(quota, exclude=["workspace"]), **unreadable}
            if quota.pk is None or before != [getattr(quota, name) for name in amounts]:
                keep.append(quota)
        found.append(said)
    if any(found):
        problems["quotas"] = found
    gone = [quota for key, quota in existing.items() if key not in seen]
    return keep, gone


def _member_rows(rows: Sequence[MemberRow], problems: dict[str, Any]) -> list[tuple[Any, Role]]:
    users = get_user_model()
    wanted = {row.username for row in rows}
    found_users = {user.get_username(): user for user in users.objects.filter(username__in=wanted)}
    members: list[tuple[Any, Role]] = []
    found: list[dict[str, list[str]]] = []
    seen: set[str] = set()
    for row in rows:
        said: dict[str, list[str]] = {}
        user = found_users.get(row.username)
        if user is None:
            said["username"] = [
                f"No user named {row.username!r}: people appear after their first login "
                "(or are created in the admin)."
            ]
        elif row.username in seen:
            said["username"] = [f"{row.username!r} is given twice."]
        elif row.role not in Role.values:
            said["role"] = [f"Choose one of {', '.join(Role.values)}."]
        else:
            seen.add(row.username)
            members.append((user, Role(row.role)))
        found.append(said)
    if any(found):
        problems["members"] = found
    elif not any(role == Role.ADMIN for _, role in members):
        # Someone must be able to manage its members, tokens and webhooks from the start.
        problems["members"] = [
            "A workspace needs an admin: name at least one admin among its members."
        ]
    return members


def _write_quotas(keep: list[WorkspaceQuota], gone: list[WorkspaceQuota]) -> None:
    """Delete the rows no longer named, then save the new and changed ones (unchanged rows
    are not in ``keep``: no write, no audit event)."""
    for quota in gone:
        quota.delete()
    for quota in keep:
        quota.save()


def create_workspace(
    *,
    slug: str,
    fields: Mapping[str, Any],
    cohort: str | None = None,
    members: Sequence[MemberRow] = (),
    quotas: Sequence[QuotaRow] = (),
) -> Workspace:
    problems: dict[str, Any] = {}
    workspace = Workspace(
        slug=slug, **{key: fields[key] for key in WORKSPACE_FIELDS if key in fields}
    )
    workspace.cohort = _cohort(cohort, problems)
    problems.update(_checked(workspace))
    chosen = _member_rows(members, problems)
    keep, gone = _quota_rows(workspace, quotas, problems)
    if problems:
        raise Refused(problems)
    with transaction.atomic():
        workspace.save()
        for user, role in chosen:
            Membership.objects.create(workspace=workspace, user=user, role=role)
        _write_quotas(keep, gone)
    return workspace


_UNCHANGED: Any = object()


def update_workspace(
    workspace: Workspace,
    *,
    fields: Mapping[str, Any],
    cohort: Any = _UNCHANGED,
    quotas: Sequence[QuotaRow] | None = None,
) -> Workspace:
    """Change what is given; ``quotas`` replaces the whole list (rows not named go)."""
    problems: dict[str, Any] = {}
    for key in WORKSPACE_FIELDS:
        if key in fields:
            setattr(workspace, key, fields[key])
    if cohort is not _UNCHANGED:
        workspace.cohort = _cohort(cohort, problems)
    keep: list[WorkspaceQuota] = []
    gone: list[WorkspaceQuota] = []
    if quotas is not None:
        keep, gone = _quota_rows(workspace, quotas, problems)
    with transaction.atomic():
        if quotas is not None and not problems:
            # First the quotas, then the workspace's own check: leaving a cohort is allowed
            # when the new rows drop their borrowing and lending limits in the same request.
            _write_quotas(keep, gone)
        problems.update(_checked(workspace))
        if problems:
            transaction.set_rollback(True)
            raise Refused(problems)
        workspace.save()
    return workspace


_M = TypeVar("_M", ResourceFlavor, Cohort)


def _save(instance: _M, fields: Mapping[str, Any], allowed: Sequence[str]) -> _M:
    for key in allowed:
        if key in fields:
            setattr(instance, key, fields[key])
    problems = _checked(instance)
    if problems:
        raise Refused(problems)
    instance.save()
    return instance


def save_flavor(flavor: ResourceFlavor | None, fields: Mapping[str, Any]) -> ResourceFlavor:
    """Create a flavor (``flavor`` None) or change one."""
    return _save(flavor or ResourceFlavor(), fields, FLAVOR_FIELDS)


def save_cohort(cohort: Cohort | None, fields: Mapping[str, Any]) -> Cohort:
    """Create a cohort (``cohort`` None) or change one."""
    return _save(cohort or Cohort(), fields, COHORT_FIELDS)
