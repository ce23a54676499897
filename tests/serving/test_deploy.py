"""Deploying an endpoint: checked whole before anything is written, every problem at once at
its place in tau.yaml; then the endpoint, its ``deployed`` event and one outbox row, in one
transaction. The services directly; tests/serving/test_api.py has the same through the API."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from runs.models import CodeBundle, Run
from serving import services
from serving.models import Endpoint, EndpointDelivery, EndpointEvent, EndpointState
from tests.runs.factories import zip_bytes
from tests.serving import fakes
from tests.serving.factories import (
    AUTOSCALING_SPEC,
    ENDPOINT_FILES,
    ENDPOINT_SPEC,
    MODEL_SPEC,
    RUN_SPEC,
    make_endpoint,
    model_version,
)

pytestmark = pytest.mark.django_db


def deploy(
    world: Any, spec: bytes, *, files: dict[str, str] | None = ENDPOINT_FILES, **kw: Any
) -> Endpoint:
    return services.deploy_endpoint(
        workspace=kw.pop("workspace", world.alpha),
        user=world.users[kw.pop("who", "researcher")],
        spec_source=spec,
        bundle=io.BytesIO(zip_bytes(files)) if files is not None else None,
        **kw,
    )


def refused(world: Any, spec: bytes, **kw: Any) -> list[dict[str, Any]]:
    """The problems of a refused deployment; nothing was written."""
    endpoints = Endpoint.objects.for_workspace(world.alpha)
    before = (endpoints.count(), EndpointEvent.objects.for_workspace(world.alpha).count())
    with pytest.raises(services.DeployRefused) as caught:
        deploy(world, spec, **kw)
    assert (endpoints.count(), EndpointEvent.objects.for_workspace(world.alpha).count()) == before
    return [problem.to_dict() for problem in caught.value.problems]


def test_a_deployment_is_written_whole(world: Any, tmp_path: Path) -> None:
    version = model_version(world, tmp_path)
    endpoint = deploy(world, MODEL_SPEC)
    assert endpoint.state == EndpointState.DEPLOYING
    assert (endpoint.generation, endpoint.replicas_desired, endpoint.replicas_ready) == (1, 1, 0)
    assert endpoint.model_version == version
    assert endpoint.model_asked == "production"
    assert endpoint.backend == "local"
    assert endpoint.url == ""
    assert endpoint.spec["serve"]["import_path"] == "app:deployment"
    assert endpoint.spec["runtime"]["image"]  # the workspace's or the platform's default
    assert endpoint.bundle is not None
    assert endpoint.bundle.file_count == 1
    (event,) = EndpointEvent.objects.for_workspace(world.alpha).filter(endpoint=endpoint)
    assert (event.kind, event.new_state) == ("deployed", "deploying")
    assert event.data["by"] == "rob"
    assert event.data["model"] == {
        "ref": "tiny-gpt@1",
        "asked": "production",
        "manifest_digest": version.manifest_digest,
    }
    assert event.data["spec_hash"] == endpoint.spec_hash
    assert event.data["image"] == endpoint.spec["runtime"]["image"]
    assert event.data["replicas"] == 1
    assert event.data["bundle"] == endpoint.bundle.sha256
    (delivery,) = EndpointDelivery.objects.for_workspace(world.alpha).filter(endpoint=endpoint)
    assert (delivery.action, delivery.generation) == ("deploy", 1)


def test_a_run_is_not_an_endpoint(world: Any) -> None:
    problems = refused(world, RUN_SPEC, files={"main.py": "print(1)\n"})
    assert problems == [
        {
            "path": "run.workload_kind",
            "line": 5,
            "column": 3,
            "message": "this tau.yaml describes a run; submit it with `tau run`",
            "hint": None,
        }
    ]
    assert Run.objects.for_workspace(world.alpha).count() == 0


def test_a_spec_with_schema_problems_says_them_all(world: Any) -> None:
    problems = refused(world, ENDPOINT_SPEC.replace(b"cpus: 1", b"cpus: lots"))
    assert [p["path"] for p in problems] == ["compute.cpus"]
    assert problems[0]["line"] == 9


def test_an_unknown_model_is_a_problem_at_its_key(world: Any, tmp_path: Path) -> None:
    problems = refused(world, MODEL_SPEC)
    assert [(p["path"], p["line"]) for p in problems] == [("serve.model.name", 8)]
    assert "no model named 'tiny-gpt'" in problems[0]["message"]


def test_an_unknown_version_or_alias_is_a_problem_at_its_key(world: Any, tmp_path: Path) -> None:
    model_version(world, tmp_path)
    alias = refused(world, MODEL_SPEC.replace(b"production", b"staging"))
    assert [p["path"] for p in alias] == ["serve.model.version"]
    assert "no alias 'staging'" in alias[0]["message"]
    number = refused(world, MODEL_SPEC.replace(b"production", b"7"))
    assert "tiny-gpt has no version 7." in number[0]["message"]


def test_another_workspaces_model_does_not_exist_here(world: Any, tmp_path: Path) -> None:
    """beta's model of the same name is not alpha's: deploying in alpha cannot reach it."""
    from catalog.ingest import asset_named, ingest_folder, set_alias

    source = tmp_path / "beta-model"
    source.mkdir()
    (source / "w.bin").write_bytes(b"beta")
    set_alias(
        ingest_folder(asset_named(world.beta, "model", "tiny-gpt"), source, source="prefix"),
        "production",
    )
    problems = refused(world, MODEL_SPEC)
    assert [p["path"] for p in problems] == ["serve.model.name"]


def test_the_request_may_name_the_model_instead(world: Any, tmp_path: Path) -> None:
    version = model_version(world, tmp_path)
    endpoint = deploy(world, ENDPOINT_SPEC, model=services.ModelChoice("tiny-gpt", "1"))
    assert endpoint.model_version == version
    assert endpoint.spec["serve"]["model"] == {"name": "tiny-gpt", "version": "1"}
    problems = refused(
        world, ENDPOINT_SPEC, model=services.ModelChoice("tiny-gpt", "9"), name="other"
    )
    assert [p["path"] for p in problems] == ["model.version"]


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        (ENDPOINT_SPEC.replace(b"replicas: 1", b"replicas: 65"), "serve.replicas"),
        (
            AUTOSCALING_SPEC.replace(b"max_replicas: 4", b"max_replicas: 100"),
            "serve.autoscaling.max_replicas",
        ),
    ],
)
def test_too_many_replicas_is_a_problem(world: Any, spec: bytes, path: str) -> None:
    problems = refused(world, spec)
    assert path in [p["path"] for p in problems]


def test_zero_replicas_is_a_problem(world: Any) -> None:
    problems = refused(world, ENDPOINT_SPEC.replace(b"replicas: 1", b"replicas: 0"))
    assert [p["path"] for p in problems] == ["serve.replicas"]


def test_every_problem_is_said_at_once(world: Any) -> None:
    """A model that does not exist, a module not in the zip and the workspace's policy: one
    answer."""
    spec = MODEL_SPEC.replace(b"cpus: 1", b"cpus: 1\n  gpus: 1\n  gpu_type: a100")
    problems = refused(world, spec, files={"other.py": ""})
    paths = {p["path"] for p in problems}
    assert {"serve.model.name", "serve.import_path", "compute.gpu_type"} <= paths


def test_the_import_path_module_must_be_in_the_zip(world: Any) -> None:
    problems = refused(world, ENDPOINT_SPEC, files={"server.py": ""})
    assert [p["path"] for p in problems] == ["serve.import_path"]
    assert "app.py" in problems[0]["message"]
    assert "server.py" in problems[0]["hint"]
    # A package works, and a zip of the project's folder is unwrapped.
    assert deploy(world, ENDPOINT_SPEC, files={"app/__init__.py": ""}, name="pkg").bundle
    wrapped = deploy(world, ENDPOINT_SPEC, files={"project/app.py": ""}, name="wrapped")
    assert wrapped.bundle is not None
    assert wrapped.bundle.file_count == 1
    # Without a zip the image may hold it.
    assert deploy(world, ENDPOINT_SPEC, files=None, name="from-image").bundle is None


def test_the_bundle_is_kept_as_a_runs_is(world: Any) -> None:
    first = deploy(world, ENDPOINT_SPEC, name="one")
    second = deploy(world, ENDPOINT_SPEC, name="two")
    assert first.bundle == second.bundle
    assert CodeBundle.objects.for_workspace(world.alpha).count() == 1


def test_a_name_in_use_is_refused_and_free_again_once_deleted(world: Any) -> None:
    endpoint = deploy(world, ENDPOINT_SPEC)
    with pytest.raises(services.NameTaken):
        deploy(world, ENDPOINT_SPEC)
    assert Endpoint.objects.for_workspace(world.alpha).count() == 1
    services.delete_endpoint(endpoint=endpoint, user=world.users["researcher"])
    again = deploy(world, ENDPOINT_SPEC)
    assert again.name == endpoint.name
    assert again.pk != endpoint.pk
    # Another workspace's name is its own.
    assert deploy(world, ENDPOINT_SPEC, workspace=world.beta, who="outsider").name == "chat"


@pytest.mark.parametrize("name", ["Chat", "9lives", "a" * 41, "with_underscore", "trailing-"])
def test_a_name_must_be_a_dns_label(world: Any, name: str) -> None:
    problems = refused(world, ENDPOINT_SPEC, name=name)
    assert [p["path"] for p in problems] == ["name"]


def test_a_backend_without_endpoints_refuses_up_front(world: Any, settings: Any) -> None:
    settings.TAU_BACKEND_CLASSES = fakes.without_endpoints(settings)
    with pytest.raises(services.EndpointsUnavailable) as caught:
        deploy(world, ENDPOINT_SPEC)
    assert str(caught.value) == (
        "endpoints are not available on the local backend of this installation yet"
    )
    assert Endpoint.objects.for_workspace(world.alpha).count() == 0
    assert CodeBundle.objects.for_workspace(world.alpha).count() == 0


def test_what_the_backend_could_never_give_is_a_problem(world: Any) -> None:
    fakes.BEHAVIOUR.problems = [("compute.memory", "more memory than any machine here has")]
    problems = refused(world, ENDPOINT_SPEC)
    assert problems[0]["path"] == "compute.memory"
    assert problems[0]["line"] == 10


def test_the_workspace_policy_applies(world: Any) -> None:
    problems = refused(world, ENDPOINT_SPEC + b"queue:\n  priority: urgent\n")
    assert [p["path"] for p in problems] == ["queue.priority"]
    endpoint = deploy(world, ENDPOINT_SPEC + b"queue:\n  priority: normal\n")
    assert endpoint.priority == "normal"


def test_autoscaling_starts_at_its_lower_bound(world: Any) -> None:
    endpoint = deploy(world, AUTOSCALING_SPEC)
    assert endpoint.replicas_desired == 1
    assert endpoint.spec["serve"]["autoscaling"]["max_replicas"] == 4


def test_an_endpoint_made_on_another_backend_keeps_it(world: Any) -> None:
    with override_settings(TAU_BACKEND="local"):
        endpoint = make_endpoint(world)
    assert endpoint.backend == "local"


def test_a_name_in_use_keeps_no_bundle(world: Any) -> None:
    deploy(world, ENDPOINT_SPEC, files=None)
    with pytest.raises(services.NameTaken):
        deploy(world, ENDPOINT_SPEC)
    assert CodeBundle.objects.for_workspace(world.alpha).count() == 0
