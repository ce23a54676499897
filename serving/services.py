"""What people and backends do to endpoints: deploy one, update it, scale it, stop it, delete
it; and what a backend's supervisor observes of it (``observe``, ``record_metrics``).

Each change is one transaction that records it (the endpoint, its state, its history) with
what the backend must be told (an :class:`EndpointDelivery` through ``serving.delivery``):
the backend is never called inside it. A deployment is checked whole before anything is
written, as a run's submission is (``runs.submission``: the same tau.yaml reading, the same
workspace policy for compute, priority and images, the same bundle storage), and every
problem is said at once, pointed at its place in tau.yaml.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from datetime import timedelta
from pathlib import PurePosixPath
from typing import IO, TYPE_CHECKING, Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from catalog.ingest import find_version
from catalog.models import Asset, AssetVersion
from catalog.runs import handed_over
from runs import bundles, policy
from runs.models import CodeBundle
from runs.submission import MAX_SPEC_BYTES, SubmissionProblem, reading_of
from serving import preemption
from serving.backends import EndpointsUnavailable, endpoint_backend
from serving.delivery import write_delivery
from serving.events import append_event
from serving.models import (
    NAME_MAX_LENGTH,
    TRANSITIONS,
    Endpoint,
    EndpointDelivery,
    EndpointEvent,
    EndpointEventKind,
    EndpointState,
)
from serving.state import EndpointActionRefused, lock_endpoint, transition
from serving.workload_tokens import revoke_endpoint_tokens
from tau.k8s_names import dns1035_label_problem
from tau.spec import locate, spec_from_dict, spec_hash
from tau.spec.model import ModelRef

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from tau.spec import Spec
    from workspaces.models import Workspace

logger = logging.getLogger(__name__)

#: The most replicas an endpoint may ask for, fixed or autoscaled.
MAX_REPLICAS = 64

RUN_NOT_ENDPOINT = "this tau.yaml describes a run; submit it with `tau run`"

#: What an endpoint says of a state a backend observed without saying why.
SAID_OF_STATE = {
    EndpointState.DEPLOYING: "Being deployed.",
    EndpointState.READY: "Answering requests.",
    EndpointState.UPDATING: "Rolling out a new generation; the one before answers meanwhile.",
    EndpointState.UNHEALTHY: "Running, but not healthy.",
    EndpointState.STOPPED: "Stopped.",
    EndpointState.FAILED: "It failed.",
}

__all__ = [
    "MAX_REPLICAS",
    "DeployRefused",
    "EndpointActionRefused",
    "EndpointsUnavailable",
    "ModelChoice",
    "NameTaken",
    "delete_endpoint",
    "deploy_endpoint",
    "note_request",
    "observe",
    "record_metrics",
    "record_model_staged",
    "scale_endpoint",
    "stop_endpoint",
    "update_endpoint",
]


class DeployRefused(ValueError):
    """A deployment or update that cannot be made: every problem at once (nothing written)."""

    def __init__(self, problems: list[SubmissionProblem]) -> None:
        super().__init__("; ".join(f"{p.path}: {p.message}" for p in problems))
        self.problems = problems


class NameTaken(ValueError):
    """The workspace has an endpoint of that name already (one not deleted)."""


@dataclass(frozen=True)
class ModelChoice:
    """A model version asked for outside tau.yaml (the API's ``model``): it replaces the
    spec's ``serve.model``. ``version``: a number or an alias, as written."""

    name: str
    version: str


@dataclass(frozen=True)
class _Checked:
    """A deployment (or an update's new spec) as it will be written."""

    spec: Spec
    source: str
    model_version: AssetVersion | None
    model_asked: str
    priority: str
    priority_value: int
    bundle: CodeBundle | None
    unwrapped_folder: str | None


# --- Reading and checking a deployment -----------------------------------------------------


def _at(source: bytes, path: str, message: str, hint: str | None = None) -> SubmissionProblem:
    """A problem found after the schema, at its line in tau.yaml when it has one."""
    path = reading_of(source).written_at(path)
    where = locate(source, path)
    line, column = where if where else (None, None)
    return SubmissionProblem(path, message, line=line, column=column, hint=hint)


def _read(source: bytes, *, model: ModelChoice | None) -> tuple[Spec | None, list[Any]]:
    """The endpoint's spec from tau.yaml text (``model`` replacing its ``serve.model``), or
    the problems that make it none."""
    if len(source) > MAX_SPEC_BYTES:
        return None, [
            SubmissionProblem("spec", f"tau.yaml is larger than {MAX_SPEC_BYTES // 1024} KiB.")
        ]
    reading = reading_of(source)
    if reading.spec is None:
        return None, [
            SubmissionProblem(
                p.path, p.message, line=p.line or None, column=p.column or None, hint=p.hint
            )
            for p in reading.problems
        ]
    spec = reading.spec
    if not spec.is_endpoint or spec.serve is None:
        return None, [_at(source, "run.workload_kind", RUN_NOT_ENDPOINT)]
    if model is not None:
        serve = dataclasses.replace(spec.serve, model=ModelRef(model.name, model.version))
        spec = dataclasses.replace(spec, serve=serve)
    return spec, []


def _replica_problems(source: bytes, spec: Spec) -> list[SubmissionProblem]:
    serve = spec.serve
    assert serve is not None
    problems = []
    if serve.replicas is not None and not 1 <= serve.replicas <= MAX_REPLICAS:
        problems.append(
            _at(
                source,
                "serve.replicas",
                f"{serve.replicas} replicas: an endpoint has 1 to {MAX_REPLICAS}.",
            )
        )
    if serve.autoscaling is not None and serve.autoscaling.max_replicas > MAX_REPLICAS:
        problems.append(
            _at(
                source,
                "serve.autoscaling.max_replicas",
                f"at most {MAX_REPLICAS} replicas, not {serve.autoscaling.max_replicas}.",
            )
        )
    return problems


def _model_problems(
    source: bytes, spec: Spec, workspace: Workspace, *, from_request: bool
) -> tuple[list[SubmissionProblem], AssetVersion | None]:
    """The ready model version ``serve.model`` names (an alias resolved now, once), or the
    problem at its key (``model`` when the request, not tau.yaml, named it)."""
    serve = spec.serve
    assert serve is not None
    if serve.model is None:
        return [], None
    wanted = serve.model

    def problem(key: str, message: str) -> SubmissionProblem:
        if from_request:
            return SubmissionProblem(f"model.{key}", message)
        return _at(source, f"serve.model.{key}", message)

    if wanted.from_stage is not None:
        # A pipeline's stage: the model version the stage before it made.
        found, made = handed_over(Asset.Kind.MODEL, "serve.model", wanted.from_stage)
        if found is not None:
            return [_at(source, found[0], found[1])], None
        if made is None:  # the pipeline is being checked: its stages have made nothing yet
            return [], None
        return [], made
    asset = (
        None
        if "\x00" in wanted.name
        else Asset.objects.for_workspace(workspace)
        .filter(kind=Asset.Kind.MODEL, name=wanted.name)
        .first()
    )
    if asset is None:
        return [
            problem(
                "name",
                f"this workspace has no model named {wanted.name!r} (`tau data model list` "
                "shows its models).",
            )
        ], None
    version = find_version(workspace, asset, wanted.version)
    if version is None:
        if wanted.version == "latest":
            said = f"{wanted.name} has no ready version yet."
        elif wanted.version.isdecimal():
            said = f"{wanted.name} has no version {wanted.version}."
        else:
            said = f"{wanted.name} has no alias {wanted.version!r}; name a version or an alias."
        return [problem("version", said)], None
    if version.state != AssetVersion.State.READY:
        why = f": {version.error}" if version.error else ""
        return [
            problem("version", f"{wanted.name}@{version.number} is {version.state}, not ready{why}")
        ], None
    return [], version


def _import_path_problem(
    source: bytes, spec: Spec, listing: bundles.BundleListing | None
) -> tuple[list[SubmissionProblem], str | None]:
    """(problems, the zip's folder to unwrap): the module of ``serve.import_path`` must be a
    file of the project zip when one is given (``app:deployment`` → ``app.py`` or
    ``app/__init__.py``); without a zip it may come with the image."""
    serve = spec.serve
    assert serve is not None
    if listing is None:
        return [], None
    module = serve.import_path.partition(":")[0]
    base = PurePosixPath(*module.split("."))
    candidates = [f"{base}.py", f"{base}/__init__.py"]
    if any(candidate in listing.files for candidate in candidates):
        return [], None
    if listing.wrapper is not None and any(
        f"{listing.wrapper}/{candidate}" in listing.files for candidate in candidates
    ):
        return [], listing.wrapper
    sample = ", ".join(sorted(listing.files)[:5]) or "no files"
    return [
        _at(
            source,
            "serve.import_path",
            f"names the module {module}, which is not in the project zip ({candidates[0]} or "
            f"{candidates[1]}).",
            hint=f"the zip holds {sample}",
        )
    ], None


def _check(
    *,
    workspace: Workspace,
    source: bytes,
    model: ModelChoice | None,
    backend: str,
    bundle: IO[bytes] | None,
    extra: list[SubmissionProblem] | None = None,
    replicas: int | None = None,
    replacing: int | None = None,
) -> _Checked:
    """Everything a deployment (or an update's new spec) must pass, checked before anything
    is written; the bundle kept once it all passes. ``DeployRefused`` with every problem.
    ``replicas``: what the generation runs when not the spec's; ``replacing``: the endpoint
    it is a new generation of (its own quota is not counted twice)."""
    endpoints = endpoint_backend(backend)  # EndpointsUnavailable before anything else
    problems: list[SubmissionProblem] = list(extra or [])
    spec, found = _read(source, model=model)
    problems += found
    placement = None
    version = None
    if spec is not None:
        problems += _replica_problems(source, spec)
        problems += [_at(source, p, m) for p, m in endpoints.deploy_problems(spec, workspace)]
        try:
            placement = policy.apply_policy(spec, workspace, backend=backend)
        except policy.PolicyRefused as exc:
            said = {(p.path, p.message) for p in problems}
            problems += [
                _at(source, p.path, p.message)
                for p in exc.problems
                if (p.path, p.message) not in said
            ]
        if placement is not None and placement.spec.serve is not None:
            placement, found_here = preemption.place(
                placement, asked=spec.queue.priority, workspace=workspace, endpoints=endpoints
            )
            found_here += preemption.quota_problems(
                placement.spec,
                replicas=replicas if replicas is not None else _replicas_of(placement.spec),
                workspace=workspace,
                backend=backend,
                endpoints=endpoints,
                replacing=replacing,
            )
            problems += [_at(source, p, m) for p, m in found_here]
        found, version = _model_problems(source, spec, workspace, from_request=model is not None)
        problems += found
    staged = None
    try:
        if bundle is not None:
            try:
                staged = bundles.stage_upload(bundle)
            except bundles.BundleRejected as exc:
                problems.append(SubmissionProblem("bundle", str(exc)))
        unwrap = None
        if spec is not None and (bundle is None or staged is not None):
            found, unwrap = _import_path_problem(source, spec, staged.listing if staged else None)
            problems += found
        if problems or placement is None:
            raise DeployRefused(problems)
        stored = bundles.keep(staged, workspace=workspace, unwrap=unwrap) if staged else None
    finally:
        if staged is not None:
            bundles.discard(staged)
    serve = placement.spec.serve
    assert serve is not None
    return _Checked(
        spec=placement.spec,
        source=source.decode("utf-8"),
        model_version=version,
        model_asked=(
            ""
            if serve.model is None
            else f"from:{serve.model.from_stage}"
            if serve.model.from_stage
            else serve.model.version
        ),
        priority=placement.priority,
        priority_value=placement.priority_value,
        bundle=stored,
        unwrapped_folder=unwrap,
    )


def _refuse_past_quota(
    source: bytes,
    spec: Spec,
    *,
    replicas: int,
    workspace: Workspace,
    backend: str,
    replacing: int | None = None,
) -> None:
    """``DeployRefused`` where :func:`serving.preemption.quota_problems` finds any: the
    check again inside the writing transaction, the workspace locked
    (``preemption.locked_workspace``), after :func:`_check` made it with every other one."""
    late = preemption.quota_problems(
        spec,
        replicas=replicas,
        workspace=workspace,
        backend=backend,
        endpoints=endpoint_backend(backend),
        replacing=replacing,
    )
    if late:
        raise DeployRefused([_at(source, path, message) for path, message in late])


def _name_problem(name: str) -> SubmissionProblem | None:
    problem = dns1035_label_problem(name, max_length=NAME_MAX_LENGTH)
    return SubmissionProblem("name", f"{name!r} {problem}.") if problem else None


def _replicas_of(spec: Spec) -> int:
    serve = spec.serve
    assert serve is not None
    if serve.replicas is not None:
        return serve.replicas
    assert serve.autoscaling is not None
    return max(1, serve.autoscaling.min_replicas)


def _described(endpoint: Endpoint, checked: _Checked | None = None) -> dict[str, Any]:
    """What the history records of the endpoint's configuration as it now is."""
    spec = endpoint.spec
    serve = spec.get("serve") or {}
    version = checked.model_version if checked is not None else endpoint.model_version
    return {
        "generation": endpoint.generation,
        "spec_hash": endpoint.spec_hash,
        "image": (spec.get("runtime") or {}).get("image"),
        "replicas": endpoint.replicas_desired,
        "autoscaling": serve.get("autoscaling"),
        "model": None
        if version is None
        else {
            "ref": version.ref,
            "asked": endpoint.model_asked,
            "manifest_digest": version.manifest_digest,
        },
        "bundle": endpoint.bundle.sha256 if endpoint.bundle is not None else None,
    }


def _who(user: User | None) -> str:
    return user.get_username() if user is not None else "the system"


# --- What people do ------------------------------------------------------------------------


def deploy_endpoint(
    *,
    workspace: Workspace,
    user: User,
    spec_source: bytes,
    bundle: IO[bytes] | None = None,
    model: ModelChoice | None = None,
    name: str | None = None,
) -> Endpoint:
    """Deploy an endpoint from tau.yaml (``run.workload_kind: rayservice``) and its project zip,
    on the installation's backend: checked whole, then the endpoint, its ``deployed`` event
    and the delivery that hands it to the backend written in one transaction.

    ``EndpointsUnavailable`` when the backend does not run endpoints, ``DeployRefused`` with
    every problem, ``NameTaken`` when the name is in use: in each case nothing is written."""
    backend = settings.TAU_BACKEND
    endpoint_backend(backend)  # EndpointsUnavailable before anything else
    # A name in use is said before the project zip is read and kept.
    early = name if name is not None else _endpoint_name_in(spec_source)
    if early is not None and _name_in_use(workspace, early):
        raise NameTaken(f"This workspace has an endpoint named {early!r} already.")
    extra: list[SubmissionProblem] = []
    if name is not None and (problem := _name_problem(name)) is not None:
        extra.append(problem)
    checked = _check(
        workspace=workspace,
        source=spec_source,
        model=model,
        backend=backend,
        bundle=bundle,
        extra=extra,
    )
    endpoint_name = name if name is not None else checked.spec.name
    if name is None and (problem := _name_problem(endpoint_name)) is not None:
        raise DeployRefused([problem])
    if _name_in_use(workspace, endpoint_name):
        raise NameTaken(f"This workspace has an endpoint named {endpoint_name!r} already.")
    try:
        with transaction.atomic():
            # Again, now that no other deployment, scale or update of this workspace's
            # endpoints can write meanwhile: one may have since the check above.
            _refuse_past_quota(
                spec_source,
                checked.spec,
                replicas=_replicas_of(checked.spec),
                workspace=preemption.locked_workspace(workspace.pk),
                backend=backend,
            )
            endpoint = Endpoint.objects.create(
                workspace=workspace,
                name=endpoint_name,
                spec=checked.spec.to_dict(),
                spec_hash=spec_hash(checked.spec),
                spec_source=checked.source,
                bundle=checked.bundle,
                model_version=checked.model_version,
                model_asked=checked.model_asked,
                backend=backend,
                priority=checked.priority,
                priority_value=checked.priority_value,
                state=EndpointState.DEPLOYING,
                state_reason="Accepted; handing it to the backend.",
                replicas_desired=_replicas_of(checked.spec),
                generation=1,
                created_by=user,
                created_by_username=user.get_username(),
            )
            append_event(
                endpoint,
                EndpointEventKind.DEPLOYED,
                new_state=EndpointState.DEPLOYING,
                message=f"Deployed by {user.get_username()}"
                + (
                    f"; the files inside the zip's folder {checked.unwrapped_folder}/ are the "
                    "project"
                    if checked.unwrapped_folder
                    else ""
                ),
                data={
                    "by": user.get_username(),
                    "workspace": workspace.slug,
                    "name": endpoint.name,
                    "backend": backend,
                    "priority": checked.priority,
                    **_described(endpoint, checked),
                },
                first=True,
            )
            write_delivery(endpoint=endpoint, action=EndpointDelivery.Action.DEPLOY)
    except IntegrityError:
        # Deployed under the same name at the same moment: the constraint decides.
        if _name_in_use(workspace, endpoint_name):
            raise NameTaken(
                f"This workspace has an endpoint named {endpoint_name!r} already."
            ) from None
        raise
    return endpoint


def _endpoint_name_in(source: bytes) -> str | None:
    """The ``name`` of an endpoint's tau.yaml, when it reads as one (the reading is kept for
    the checks that follow)."""
    if len(source) > MAX_SPEC_BYTES:
        return None
    spec = reading_of(source).spec
    return spec.name if spec is not None and spec.is_endpoint else None


def _name_in_use(workspace: Workspace, name: str) -> bool:
    return (
        Endpoint.objects.for_workspace(workspace)
        .filter(name=name, deleted_at__isnull=True)
        .exists()
    )


def _next_generation_state(state: EndpointState, *, rolls_out: bool) -> EndpointState:
    """The state a new generation moves an endpoint to: a stopped or failed one is deployed
    again; a running one rolls out a new configuration (``updating``; one still being
    deployed stays ``deploying``), while more or fewer replicas of the same one
    (``rolls_out`` false) leave it in its state."""
    if state in (EndpointState.STOPPED, EndpointState.FAILED):
        return EndpointState.DEPLOYING
    if rolls_out and state in (EndpointState.READY, EndpointState.UNHEALTHY):
        return EndpointState.UPDATING
    return state


def _new_generation(
    locked: Endpoint,
    *,
    kind: EndpointEventKind,
    message: str,
    data: dict[str, Any],
    fields: dict[str, Any],
    rolls_out: bool,
) -> Endpoint:
    """One more generation of the endpoint (the row locked): ``fields`` written, the state it
    moves to (:func:`_next_generation_state`), the event, and the backend's instruction."""
    old_state = EndpointState(locked.state)
    new_state = _next_generation_state(old_state, rolls_out=rolls_out)
    for field, value in fields.items():
        setattr(locked, field, value)
    locked.generation += 1
    reason = {
        EndpointState.UPDATING: f"Rolling out generation {locked.generation}.",
        EndpointState.DEPLOYING: f"Deploying generation {locked.generation}.",
    }.get(new_state, locked.state_reason)
    if new_state != old_state:
        assert new_state in TRANSITIONS[old_state]
        locked.state = new_state
        locked.state_reason = reason
    locked.save()
    append_event(
        locked,
        kind,
        message=message,
        data={**data, **_described(locked)},
        old_state=old_state if new_state != old_state else "",
        new_state=new_state if new_state != old_state else "",
    )
    write_delivery(endpoint=locked, action=EndpointDelivery.Action.DEPLOY)
    return locked


def _refuse_if_deleted(locked: Endpoint) -> None:
    if locked.deleted_at is not None:
        raise EndpointActionRefused(f"{locked.name} has been deleted.")


def scale_endpoint(*, endpoint: Endpoint, user: User | None, replicas: int) -> Endpoint:
    """Run ``replicas`` replicas (1 to MAX_REPLICAS) from the next generation on. Refused
    for an endpoint that autoscales (its replicas are Ray Serve's to choose). Asking for the
    number it has changes nothing."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"an endpoint has 1 to {MAX_REPLICAS} replicas, not {replicas}")
    with transaction.atomic():
        workspace = preemption.locked_workspace(endpoint.workspace_id)
        locked = lock_endpoint(endpoint.pk)
        _refuse_if_deleted(locked)
        if (locked.spec.get("serve") or {}).get("autoscaling"):
            raise EndpointActionRefused(
                f"{locked.name} scales itself (serve.autoscaling): change its autoscaling "
                "bounds in tau.yaml instead of its replicas."
            )
        if replicas == locked.replicas_desired and locked.state not in (
            EndpointState.STOPPED,
            EndpointState.FAILED,
        ):
            return locked
        endpoints = endpoint_backend(locked.backend)
        refused = preemption.quota_problems(
            spec_from_dict(locked.spec),
            replicas=replicas,
            workspace=workspace,
            backend=locked.backend,
            endpoints=endpoints,
            replacing=locked.pk,
        )
        if refused:
            raise EndpointActionRefused(" ".join(message for _path, message in refused))
        before = locked.replicas_desired
        return _new_generation(
            locked,
            kind=EndpointEventKind.SCALED,
            message=f"Scaled from {before} to {replicas} replicas by {_who(user)}.",
            data={"by": _who(user), "replicas_before": before},
            fields={"replicas_desired": replicas},
            rolls_out=False,
        )


def update_endpoint(
    *,
    endpoint: Endpoint,
    user: User | None,
    model: ModelChoice | None = None,
    spec_source: bytes | None = None,
    bundle: IO[bytes] | None = None,
    replicas: int | None = None,
) -> Endpoint:
    """A new generation with a new model version and/or a new tau.yaml (and project zip),
    checked as a deployment is (on the endpoint's own backend); with ``replicas`` too, the
    new generation runs that many. A running endpoint rolls it out (``updating``: the
    generation before answers until it is ready); a stopped or failed one is deployed
    again. Only the name stays: the new tau.yaml's ``name`` is not the endpoint's."""
    if spec_source is None and model is None:
        raise ValueError("an update names a model version, a tau.yaml, or both")
    if replicas is not None and not 1 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"an endpoint has 1 to {MAX_REPLICAS} replicas, not {replicas}")
    # Checked before the lock: reading, policy and the bundle take time and write files.
    source = spec_source if spec_source is not None else endpoint.spec_source.encode("utf-8")
    checked = _check(
        workspace=endpoint.workspace,
        source=source,
        model=model,
        backend=endpoint.backend,
        bundle=bundle,
        replicas=replicas
        if replicas is not None or spec_source is not None
        else endpoint.replicas_desired,
        replacing=endpoint.pk,
    )
    with transaction.atomic():
        workspace = preemption.locked_workspace(endpoint.workspace_id)
        locked = lock_endpoint(endpoint.pk)
        _refuse_if_deleted(locked)
        autoscales = checked.spec.serve is not None and checked.spec.serve.autoscaling is not None
        if replicas is not None and autoscales:
            raise EndpointActionRefused(
                f"{locked.name} scales itself (serve.autoscaling): its replicas are not set."
            )
        if spec_source is not None or autoscales:
            desired = replicas if replicas is not None else _replicas_of(checked.spec)
        else:
            desired = replicas if replicas is not None else locked.replicas_desired
        # Again under the lock: another endpoint of the workspace may have grown meanwhile.
        _refuse_past_quota(
            source,
            checked.spec,
            replicas=desired,
            workspace=workspace,
            backend=locked.backend,
            replacing=locked.pk,
        )
        fields: dict[str, Any] = {
            "spec": checked.spec.to_dict(),
            "spec_hash": spec_hash(checked.spec),
            "spec_source": checked.source,
            "model_version": checked.model_version,
            "model_asked": checked.model_asked,
            "replicas_desired": desired,
        }
        if spec_source is not None:
            fields["bundle"] = checked.bundle
        what = " and ".join(
            filter(
                None,
                [
                    f"model {checked.model_version.ref}"
                    if model is not None and checked.model_version is not None
                    else "",
                    "tau.yaml" if spec_source is not None else "",
                    "project zip" if bundle is not None else "",
                ],
            )
        )
        return _new_generation(
            locked,
            kind=EndpointEventKind.UPDATED,
            message=f"Updated ({what or 'configuration'}) by {_who(user)}.",
            data={"by": _who(user)},
            fields=fields,
            rolls_out=True,
        )


def stop_endpoint(*, endpoint: Endpoint, user: User | None) -> Endpoint:
    """Stop the endpoint: ``stopped`` now (requests are refused from this moment), and the
    backend told to stop what runs of it. A stopped endpoint stays as it is."""
    with transaction.atomic():
        locked = lock_endpoint(endpoint.pk)
        _refuse_if_deleted(locked)
        if locked.state == EndpointState.STOPPED:
            return locked
        stopped = _stop(locked, user)
        write_delivery(endpoint=stopped, action=EndpointDelivery.Action.STOP)
        return stopped


def _stop(locked: Endpoint, user: User | None) -> Endpoint:
    # Its pods fetch nothing more: the token they fetch with ends with it (under the lock
    # that issuing one takes too, so none is issued after).
    revoke_endpoint_tokens(locked)
    return transition(
        locked,
        EndpointState.STOPPED,
        reason=f"Stopped by {_who(user)}.",
        kind=EndpointEventKind.STOPPED,
        data={"by": _who(user), "generation": locked.generation},
        changes={"replicas_ready": 0},
    )


def delete_endpoint(*, endpoint: Endpoint, user: User | None) -> Endpoint:
    """Stop the endpoint (if it is not stopped) and delete it: its name is free again, its
    record and history stay (``deleted_at``). The backend is told to stop once, whatever
    state it was in (what it made of a failed endpoint is removed too)."""
    with transaction.atomic():
        locked = lock_endpoint(endpoint.pk)
        if locked.deleted_at is not None:
            return locked
        if locked.state != EndpointState.STOPPED:
            locked = _stop(locked, user)
        revoke_endpoint_tokens(locked)
        locked.deleted_at = timezone.now()
        locked.save(update_fields=["deleted_at", "updated_at"])
        append_event(
            locked,
            EndpointEventKind.DELETED,
            message=f"Deleted by {_who(user)}; its record is kept.",
            data={"by": _who(user)},
        )
        write_delivery(endpoint=locked, action=EndpointDelivery.Action.STOP)
        return locked


# --- What a backend's supervisor reports ---------------------------------------------------


def observe(
    endpoint: Endpoint,
    *,
    state: EndpointState | str | None = None,
    reason: str | None = None,
    replicas_ready: int | None = None,
    url: str | None = None,
    generation: int | None = None,
) -> bool:
    """What a backend's supervisor saw of the endpoint (the Kubernetes watcher, the local
    agent): its state and why, its ready replicas, its address. Idempotent: an observation
    that changes nothing writes nothing, so the same one twice writes one event (a change of
    state is an event; the rest is written on the row). True if anything was written.

    An observation of a generation older than the endpoint's (``generation``), of a deleted
    endpoint, or of a stopped one that is not "stopped" (its stop is on its way to the
    backend) is about the past and is not recorded."""
    with transaction.atomic():
        locked = lock_endpoint(endpoint.pk)
        if generation is not None and generation < locked.generation:
            return False
        if locked.deleted_at is not None:
            return False
        changes: dict[str, Any] = {}
        if replicas_ready is not None and replicas_ready != locked.replicas_ready:
            changes["replicas_ready"] = max(0, replicas_ready)
        if url is not None and url != locked.url:
            changes["url"] = url[:500]
        current = EndpointState(locked.state)
        wanted = EndpointState(state) if state is not None else current
        if wanted != current:
            if wanted not in TRANSITIONS[current]:
                logger.warning(
                    "endpoint %s: observed %s while it is %s; not recorded",
                    locked.name,
                    wanted,
                    current,
                )
                return False
            if wanted == EndpointState.STOPPED:
                revoke_endpoint_tokens(locked)
            transition(
                locked,
                wanted,
                reason=reason if reason is not None else SAID_OF_STATE[wanted],
                data={
                    "generation": locked.generation,
                    **changes,
                },
                changes=changes,
            )
            return True
        if reason is not None and reason != locked.state_reason:
            changes["state_reason"] = reason
        if not changes:
            return False
        Endpoint.objects.for_workspace(locked.workspace_id).filter(pk=locked.pk).update(
            **changes, updated_at=timezone.now()
        )
        return True


def record_model_staged(
    endpoint: Endpoint, *, files: int, bytes: int, seconds: float
) -> EndpointEvent:
    """One of the endpoint's pods has its model in place (a cluster's stager says so: how
    many files and bytes, how long it took); recorded in its history, as a run's staged
    datasets are in the run's (``runs.state.record_data_staged``)."""
    with transaction.atomic():
        locked = lock_endpoint(endpoint.pk)
        version = locked.model_version
        ref = version.ref if version is not None else None
        return append_event(
            locked,
            EndpointEventKind.MODEL_STAGED,
            message=f"Generation {locked.generation} staged its model"
            + (f" {ref}" if ref else "")
            + f": {files:,} files, {bytes:,} bytes in {seconds:.1f} s.",
            data={
                "generation": locked.generation,
                "model": ref,
                "files": files,
                "bytes": bytes,
                "seconds": round(seconds, 3),
            },
        )


def record_metrics(
    endpoint: Endpoint,
    *,
    requests_per_second: float | None,
    latency_p95_ms: float | None,
    error_rate: float | None,
) -> None:
    """The traffic a backend last measured for the endpoint, shown in its list and detail
    (not history: it changes every minute)."""
    now = timezone.now()
    changes: dict[str, Any] = {
        "requests_per_second": requests_per_second,
        "latency_p95_ms": latency_p95_ms,
        "error_rate": error_rate,
        "metrics_at": now,
    }
    if requests_per_second:
        # Requests reached it in the backend's window (some straight to its address, past
        # the proxy): it was used now, as far as "idle" is concerned.
        changes["last_request_at"] = now
    Endpoint.objects.for_workspace(endpoint.workspace_id).filter(pk=endpoint.pk).update(**changes)


#: How often at most the proxy writes that an endpoint was used: "idle" is counted in hours,
#: and one small write a minute costs a busy endpoint's requests nothing they would notice.
REQUEST_NOTED_EVERY = timedelta(minutes=1)


def note_request(endpoint: Endpoint) -> None:
    """A request is being sent to the endpoint through the portal's proxy: ``last_request_at``
    says so, written at most once a minute (no query at all when the endpoint as read says
    it was noted less than a minute ago)."""
    now = timezone.now()
    last = endpoint.last_request_at
    if last is not None and now - last < REQUEST_NOTED_EVERY:
        return
    noted = Endpoint.objects.for_workspace(endpoint.workspace_id).filter(pk=endpoint.pk)
    noted.filter(
        Q(last_request_at__isnull=True) | Q(last_request_at__lt=now - REQUEST_NOTED_EVERY)
    ).update(last_request_at=now)
    endpoint.last_request_at = now
