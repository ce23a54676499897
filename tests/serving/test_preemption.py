"""A workspace that keeps its endpoints from being preempted (``endpoint_preemption: never``,
the default) on a backend that preempts (Kueue's): endpoints run at its highest priority and,
in a cohort, within its own nominal quota; what would break either is refused up front, and
nothing is written. With ``allowed``, or where nothing preempts, none of it applies.
serving/preemption.py has the reasons; the fake backend preempts when told to."""

from __future__ import annotations

import io
import re
import threading
import time
from decimal import Decimal
from html import unescape
from typing import Any

import pytest
from django.db import connection

from executors.kubernetes.endpoints import KubernetesEndpoints
from serving import preemption, services
from serving.models import Endpoint, EndpointEvent, EndpointState
from serving.state import EndpointActionRefused
from tau.spec import load_spec
from tests.runs.factories import zip_bytes
from tests.serving import fakes
from tests.serving.factories import ENDPOINT_FILES, ENDPOINT_SPEC, make_endpoint
from workspaces.models import EndpointPreemption, PriorityClass, Workspace

pytestmark = pytest.mark.django_db


def gpu_spec(name: str, *, gpus: int, replicas: int, priority: str | None = None) -> bytes:
    spec = (
        ENDPOINT_SPEC.replace(b"name: chat", f"name: {name}".encode())
        .replace(b"  replicas: 1\n", f"  replicas: {replicas}\n".encode())
        .replace(b"  cpus: 1\n", f"  cpus: 1\n  gpus: {gpus}\n".encode())
    )
    if priority is not None:
        spec += f"queue:\n  priority: {priority}\n".encode()
    return spec


def deploy(world: Any, spec: bytes) -> Endpoint:
    return services.deploy_endpoint(
        workspace=world.alpha,
        user=world.users["researcher"],
        spec_source=spec,
        bundle=io.BytesIO(zip_bytes(ENDPOINT_FILES)),
    )


def refused(world: Any, spec: bytes) -> list[dict[str, Any]]:
    before = (
        Endpoint.objects.for_workspace(world.alpha).count(),
        EndpointEvent.objects.for_workspace(world.alpha).count(),
    )
    with pytest.raises(services.DeployRefused) as caught:
        deploy(world, spec)
    after = (
        Endpoint.objects.for_workspace(world.alpha).count(),
        EndpointEvent.objects.for_workspace(world.alpha).count(),
    )
    assert after == before
    return [problem.to_dict() for problem in caught.value.problems]


def policy(world: Any, value: str) -> None:
    Workspace.unscoped_objects.filter(pk=world.alpha.pk).update(endpoint_preemption=value)
    world.alpha.refresh_from_db()


@pytest.fixture
def preempting() -> None:
    fakes.BEHAVIOUR.preempts = True


@pytest.fixture
def serving_class(world: Any) -> None:
    """alpha allows ``normal`` (1000, its runs' default) and ``serving`` (5000)."""
    PriorityClass.objects.create(name="serving", value=5000)
    Workspace.unscoped_objects.filter(pk=world.alpha.pk).update(
        allowed_priorities=["normal", "serving"], default_priority="normal"
    )
    world.alpha.refresh_from_db()


def test_the_default_policy_is_never(world: Any) -> None:
    assert world.alpha.endpoint_preemption == EndpointPreemption.NEVER


def test_a_blank_policy_saved_past_the_form_is_never(
    world: Any, preempting: None, serving_class: None
) -> None:
    policy(world, "")
    assert deploy(world, gpu_spec("chat", gpus=1, replicas=1)).priority == "serving"
    world.alpha.full_clean()  # the admin's form: a blank is the default
    assert world.alpha.endpoint_preemption == EndpointPreemption.NEVER


def test_an_endpoint_runs_at_the_workspace_s_highest_priority(
    world: Any, preempting: None, serving_class: None
) -> None:
    endpoint = deploy(world, gpu_spec("chat", gpus=1, replicas=1))
    assert (endpoint.priority, endpoint.priority_value) == ("serving", 1)
    assert endpoint.spec["queue"]["priority"] == "serving"  # what the RayService carries


def test_a_lower_priority_named_is_refused_saying_what_to_do(
    world: Any, preempting: None, serving_class: None
) -> None:
    (problem,) = refused(world, gpu_spec("chat", gpus=1, replicas=1, priority="normal"))
    assert problem["path"] == "queue.priority"
    assert "highest priority, 'serving'" in problem["message"]
    assert "allow endpoint preemption" in problem["message"]
    # The top class itself is fine.
    endpoint = deploy(world, gpu_spec("chat", gpus=1, replicas=1, priority="serving"))
    assert endpoint.priority == "serving"


def test_allowed_treats_endpoints_like_runs(
    world: Any, preempting: None, serving_class: None
) -> None:
    policy(world, EndpointPreemption.ALLOWED)
    endpoint = deploy(world, gpu_spec("chat", gpus=1, replicas=1))
    assert endpoint.priority == "normal"  # the workspace's default, as for a run
    # And past the nominal quota (8 GPUs): it may borrow, and be preempted.
    assert deploy(world, gpu_spec("big", gpus=4, replicas=3)).replicas_desired == 3


def test_where_nothing_preempts_the_policy_asks_nothing(world: Any, serving_class: None) -> None:
    endpoint = deploy(world, gpu_spec("chat", gpus=4, replicas=3, priority="normal"))
    assert endpoint.priority == "normal"


def test_in_a_cohort_endpoints_must_fit_the_own_nominal_quota(world: Any, preempting: None) -> None:
    first = deploy(world, gpu_spec("chat", gpus=2, replicas=3))  # 6 of alpha's 8 GPUs
    assert first.state == EndpointState.DEPLOYING
    (problem,) = refused(world, gpu_spec("big", gpus=2, replicas=2))
    assert problem["path"] == "serve.replicas"
    message = problem["message"]
    assert "own nominal quota of GPUs, 8" in message
    assert "other live endpoints hold 6 and this one would hold 4" in message
    # One that fits beside it is deployed; a stopped endpoint holds nothing.
    deploy(world, gpu_spec("small", gpus=2, replicas=1))
    services.stop_endpoint(endpoint=first, user=world.users["researcher"])
    deploy(world, gpu_spec("big", gpus=2, replicas=2))


def test_alone_past_the_quota_is_refused_too(world: Any, preempting: None) -> None:
    (problem,) = refused(world, gpu_spec("big", gpus=3, replicas=3))
    assert "this endpoint would hold 9" in problem["message"]


def test_outside_a_cohort_nothing_can_be_reclaimed(world: Any, preempting: None) -> None:
    Workspace.unscoped_objects.filter(pk=world.alpha.pk).update(cohort=None)
    world.alpha.refresh_from_db()
    # Kueue admits at most the nominal quota there: it waits, and no lender can take it back.
    assert deploy(world, gpu_spec("big", gpus=3, replicas=3)).replicas_desired == 3


def test_a_scale_past_the_quota_is_refused_and_its_own_share_counts_once(
    world: Any, preempting: None
) -> None:
    endpoint = deploy(world, gpu_spec("chat", gpus=2, replicas=3))
    with pytest.raises(EndpointActionRefused, match="would hold 10"):
        services.scale_endpoint(endpoint=endpoint, user=world.users["researcher"], replicas=5)
    endpoint.refresh_from_db()
    assert (endpoint.generation, endpoint.replicas_desired) == (1, 3)
    scaled = services.scale_endpoint(endpoint=endpoint, user=world.users["researcher"], replicas=4)
    assert (scaled.generation, scaled.replicas_desired) == (2, 4)


def test_an_update_is_checked_with_the_replicas_it_runs(world: Any, preempting: None) -> None:
    endpoint = deploy(world, gpu_spec("chat", gpus=2, replicas=3))
    with pytest.raises(services.DeployRefused) as caught:
        services.update_endpoint(
            endpoint=endpoint,
            user=world.users["researcher"],
            spec_source=gpu_spec("chat", gpus=3, replicas=3),
            bundle=io.BytesIO(zip_bytes(ENDPOINT_FILES)),
        )
    assert "this endpoint would hold 9" in caught.value.problems[0].message
    updated = services.update_endpoint(
        endpoint=endpoint,
        user=world.users["researcher"],
        spec_source=gpu_spec("chat", gpus=4, replicas=2),
        bundle=io.BytesIO(zip_bytes(ENDPOINT_FILES)),
    )
    assert updated.generation == 2


def test_endpoints_of_another_workspace_do_not_count(world: Any, preempting: None) -> None:
    make_endpoint(
        world, workspace=world.beta, who="outsider", spec=gpu_spec("b", gpus=4, replicas=1)
    )
    assert deploy(world, gpu_spec("chat", gpus=2, replicas=4)).replicas_desired == 4


def test_kueue_reserves_the_head_and_one_worker_per_replica() -> None:
    endpoints = KubernetesEndpoints(backend=None)  # type: ignore[arg-type]
    fixed = load_spec(gpu_spec("chat", gpus=2, replicas=3))
    held = endpoints.quota_held(fixed, 3)
    head = fixed.compute.ray_head
    assert held["nvidia.com/gpu"] == Decimal(6)
    assert held["cpu"] == Decimal(3) + Decimal(head.cpus)
    autoscaling = load_spec(
        ENDPOINT_SPEC.replace(
            b"  replicas: 1\n",
            b"  autoscaling: {min_replicas: 1, max_replicas: 4, target_ongoing_requests: 2}\n",
        )
    )
    # The worker group is fixed at max_replicas whatever Ray Serve runs inside it.
    assert endpoints.quota_held(autoscaling, 1)["cpu"] == Decimal(4) + Decimal(head.cpus)
    assert "nvidia.com/gpu" not in endpoints.quota_held(autoscaling, 1)


def test_the_endpoint_s_page_says_what_may_preempt_it(world: Any) -> None:
    deploy(world, gpu_spec("chat", gpus=1, replicas=1))
    client = world.client_for("viewer")

    def said() -> str:
        response = client.get("/w/alpha/endpoints/chat/")
        assert response.status_code == 200
        (found,) = re.findall(r'<dd class="endpoint-preemption">([^<]*)</dd>', response.text)
        return unescape(str(found))

    assert said() == "Nothing preempts it on this backend."
    fakes.BEHAVIOUR.preempts = True
    assert said().startswith("Never: it runs at the workspace's highest priority")
    policy(world, EndpointPreemption.ALLOWED)
    assert said() == "Allowed, like runs (the workspace's policy)."


def test_a_deployment_that_another_one_outran_is_refused_at_the_write(
    world: Any, preempting: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quota is checked again when the endpoint is written: another deployment that
    took the quota between this one's check and its write is seen, and nothing is written."""
    checked = services._check

    def outran(**arguments: Any) -> Any:
        passed = checked(**arguments)
        monkeypatch.setattr(services, "_check", checked)  # the other one checks as usual
        deploy(world, gpu_spec("other", gpus=2, replicas=3))  # 6 of alpha's 8 GPUs
        return passed

    monkeypatch.setattr(services, "_check", outran)
    with pytest.raises(services.DeployRefused) as caught:
        deploy(world, gpu_spec("chat", gpus=2, replicas=2))
    (problem,) = caught.value.problems
    assert problem.path == "serve.replicas"
    assert "other live endpoints hold 6 and this one would hold 4" in problem.message
    assert list(Endpoint.objects.for_workspace(world.alpha).values_list("name", flat=True)) == [
        "other"
    ]


@pytest.mark.django_db(transaction=True)
def test_two_scales_at_once_cannot_both_take_the_last_of_the_quota(
    world: Any, preempting: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scales of two endpoints of a workspace check its quota one after the other (its row
    locked): the second waits for the first, then sees what it wrote. Without the lock both
    would count on the same free GPUs (each under its own endpoint's lock only)."""
    x = deploy(world, gpu_spec("x", gpus=2, replicas=1))
    y = deploy(world, gpu_spec("y", gpus=2, replicas=1))
    real = preemption.quota_problems
    checked, release = threading.Event(), threading.Event()

    def pausing(*args: Any, **kwargs: Any) -> list[tuple[str, str]]:
        found = real(*args, **kwargs)
        if threading.current_thread().name == "scale-x":
            checked.set()
            assert release.wait(30), "never released"
        return found

    monkeypatch.setattr(preemption, "quota_problems", pausing)
    outcomes: dict[str, Any] = {}

    def scale(endpoint: Endpoint, replicas: int) -> None:
        try:
            outcomes[endpoint.name] = services.scale_endpoint(
                endpoint=endpoint, user=world.users["researcher"], replicas=replicas
            )
        except Exception as exc:  # the outcome is what the test reads
            outcomes[endpoint.name] = exc
        finally:
            connection.close()

    first = threading.Thread(target=scale, args=(x, 3), name="scale-x")  # 6 + 2 of 8
    first.start()
    assert checked.wait(30), "the first scale never checked the quota"
    second = threading.Thread(target=scale, args=(y, 2), name="scale-y")  # would be 6 + 4
    second.start()
    with connection.cursor() as cursor:  # the second waits for the first's lock

        def waiting() -> bool:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            return bool(cursor.fetchone()[0])

        deadline = time.monotonic() + 30
        while not waiting():
            assert time.monotonic() < deadline, outcomes
            time.sleep(0.05)
    release.set()
    first.join(30)
    second.join(30)
    assert isinstance(outcomes["x"], Endpoint), outcomes
    assert outcomes["x"].replicas_desired == 3
    assert isinstance(outcomes["y"], EndpointActionRefused), outcomes
    assert "other live endpoints hold 6 and this one would hold 4" in str(outcomes["y"])
    y.refresh_from_db()
    assert (y.generation, y.replicas_desired) == (1, 1)
