"""What people do to an endpoint after deploying it (scale, update, stop, delete) and what a
backend's supervisor observes of it; the outbox row each instruction is, written once and
delivered outside any transaction; a delivery that keeps failing fails the endpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from serving import delivery, services
from serving.events import verify_event_chain
from serving.models import Endpoint, EndpointDelivery, EndpointEvent, EndpointState
from serving.state import EndpointActionRefused
from tests.serving import fakes
from tests.serving.factories import (
    AUTOSCALING_SPEC,
    ENDPOINT_SPEC,
    MODEL_SPEC,
    make_endpoint,
    model_version,
)

pytestmark = pytest.mark.django_db


def kinds(endpoint: Endpoint) -> list[str]:
    return list(
        EndpointEvent.objects.for_workspace(endpoint.workspace_id)
        .filter(endpoint=endpoint)
        .order_by("seq")
        .values_list("kind", flat=True)
    )


def deliveries(endpoint: Endpoint) -> list[tuple[str, int]]:
    return list(
        EndpointDelivery.objects.for_workspace(endpoint.workspace_id)
        .filter(endpoint=endpoint)
        .order_by("pk")
        .values_list("action", "generation")
    )


def fresh(endpoint: Endpoint) -> Endpoint:
    return Endpoint.objects.for_workspace(endpoint.workspace_id).get(pk=endpoint.pk)


# --- scale ------------------------------------------------------------------------------------


def test_scaling_is_a_new_generation_with_one_instruction(world: Any) -> None:
    endpoint = make_endpoint(world, state=EndpointState.READY)
    scaled = services.scale_endpoint(endpoint=endpoint, user=world.users["researcher"], replicas=3)
    assert (scaled.generation, scaled.replicas_desired, scaled.state) == (2, 3, "ready")
    assert kinds(endpoint) == ["deployed", "scaled"]
    event = EndpointEvent.objects.for_workspace(world.alpha).get(endpoint=endpoint, seq=2)
    assert event.data["replicas"] == 3
    assert event.data["replicas_before"] == 1
    assert event.data["generation"] == 2
    assert deliveries(endpoint) == [("deploy", 1), ("deploy", 2)]
    # The same number again changes nothing, and tells the backend nothing.
    services.scale_endpoint(endpoint=endpoint, user=world.users["researcher"], replicas=3)
    assert kinds(endpoint) == ["deployed", "scaled"]
    assert len(deliveries(endpoint)) == 2


@pytest.mark.parametrize("replicas", [0, 65, -1])
def test_replicas_are_one_to_sixty_four(world: Any, replicas: int) -> None:
    endpoint = make_endpoint(world)
    with pytest.raises(ValueError, match="1 to 64 replicas"):
        services.scale_endpoint(endpoint=endpoint, user=None, replicas=replicas)
    assert fresh(endpoint).generation == 1


def test_an_endpoint_that_autoscales_is_not_scaled(world: Any) -> None:
    endpoint = make_endpoint(world, spec=AUTOSCALING_SPEC)
    with pytest.raises(EndpointActionRefused, match="scales itself"):
        services.scale_endpoint(endpoint=endpoint, user=None, replicas=2)
    assert kinds(endpoint) == ["deployed"]


def test_scaling_a_stopped_endpoint_deploys_it_again(world: Any) -> None:
    endpoint = services.stop_endpoint(endpoint=make_endpoint(world), user=None)
    again = services.scale_endpoint(endpoint=endpoint, user=None, replicas=1)
    assert (again.state, again.generation) == ("deploying", 2)
    assert deliveries(endpoint) == [("deploy", 1), ("stop", 1), ("deploy", 2)]


# --- update -----------------------------------------------------------------------------------


def test_a_new_model_version_rolls_out(world: Any, tmp_path: Path) -> None:
    first = model_version(world, tmp_path)
    endpoint = make_endpoint(world, spec=MODEL_SPEC, state=EndpointState.READY)
    assert endpoint.model_version == first
    source = tmp_path / "v2"
    source.mkdir()
    (source / "weights.bin").write_bytes(b"better")
    from catalog.ingest import ingest_folder

    second = ingest_folder(first.asset, source, source="prefix")
    updated = services.update_endpoint(
        endpoint=endpoint,
        user=world.users["researcher"],
        model=services.ModelChoice("tiny-gpt", str(second.number)),
    )
    assert (updated.state, updated.generation) == ("updating", 2)
    assert updated.model_version == second
    event = EndpointEvent.objects.for_workspace(world.alpha).get(endpoint=endpoint, seq=2)
    assert (event.kind, event.old_state, event.new_state) == ("updated", "ready", "updating")
    assert event.data["model"]["ref"] == "tiny-gpt@2"
    assert "model tiny-gpt@2" in event.message
    assert deliveries(endpoint)[-1] == ("deploy", 2)
    assert verify_event_chain(endpoint)


def test_a_new_tau_yaml_takes_its_replicas(world: Any) -> None:
    endpoint = make_endpoint(world, state=EndpointState.UNHEALTHY)
    updated = services.update_endpoint(
        endpoint=endpoint,
        user=None,
        spec_source=ENDPOINT_SPEC.replace(b"replicas: 1", b"replicas: 2").replace(
            b"name: chat", b"name: another-name"
        ),
    )
    assert (updated.state, updated.replicas_desired, updated.name) == ("updating", 2, "chat")
    assert updated.spec["serve"]["replicas"] == 2
    assert updated.spec_hash != endpoint.spec_hash


def test_an_update_is_checked_as_a_deployment(world: Any) -> None:
    endpoint = make_endpoint(world)
    with pytest.raises(services.DeployRefused) as caught:
        services.update_endpoint(
            endpoint=endpoint, user=None, model=services.ModelChoice("missing", "1")
        )
    assert [p.path for p in caught.value.problems] == ["model.name"]
    assert fresh(endpoint).generation == 1
    assert kinds(endpoint) == ["deployed"]


def test_updating_a_failed_endpoint_deploys_it_again(world: Any) -> None:
    endpoint = make_endpoint(world, state=EndpointState.FAILED)
    updated = services.update_endpoint(endpoint=endpoint, user=None, spec_source=ENDPOINT_SPEC)
    assert (updated.state, updated.generation) == ("deploying", 2)


# --- stop and delete --------------------------------------------------------------------------


def test_stop_and_delete_keep_the_record(world: Any) -> None:
    endpoint = make_endpoint(world, state=EndpointState.READY)
    services.observe(endpoint, replicas_ready=1)
    deleted = services.delete_endpoint(endpoint=endpoint, user=world.users["workspace_admin"])
    assert deleted.state == "stopped"
    assert deleted.deleted_at is not None
    assert deleted.replicas_ready == 0
    assert kinds(endpoint) == ["deployed", "stopped", "deleted"]
    assert deliveries(endpoint) == [("deploy", 1), ("stop", 1)]
    assert verify_event_chain(endpoint)
    # Deleting again changes nothing; nor does anything else.
    services.delete_endpoint(endpoint=endpoint, user=None)
    assert len(kinds(endpoint)) == 3
    with pytest.raises(EndpointActionRefused):
        services.scale_endpoint(endpoint=endpoint, user=None, replicas=2)


def test_stopping_twice_tells_the_backend_once(world: Any) -> None:
    endpoint = make_endpoint(world)
    services.stop_endpoint(endpoint=endpoint, user=None)
    services.stop_endpoint(endpoint=endpoint, user=None)
    assert kinds(endpoint) == ["deployed", "stopped"]
    assert deliveries(endpoint) == [("deploy", 1), ("stop", 1)]


# --- observations -----------------------------------------------------------------------------


def test_the_same_observation_twice_writes_one_event(world: Any) -> None:
    endpoint = make_endpoint(world)
    seen: dict[str, Any] = {
        "state": "ready",
        "replicas_ready": 1,
        "url": "http://chat.tau-alpha.svc:8000",
    }
    assert services.observe(endpoint, **seen)
    assert not services.observe(endpoint, **seen)
    assert kinds(endpoint) == ["deployed", "state"]
    now = fresh(endpoint)
    assert (now.state, now.replicas_ready, now.url) == ("ready", 1, seen["url"])
    assert now.state_reason == "Answering requests."


def test_an_observation_within_a_state_writes_no_event(world: Any) -> None:
    endpoint = make_endpoint(world, state=EndpointState.UNHEALTHY)
    assert services.observe(
        endpoint, state="unhealthy", reason="Replica 1 is failing health checks"
    )
    assert services.observe(endpoint, replicas_ready=1)
    assert kinds(endpoint) == ["deployed"]
    assert fresh(endpoint).state_reason == "Replica 1 is failing health checks"


def test_an_old_generations_observation_is_not_recorded(world: Any) -> None:
    endpoint = make_endpoint(world, state=EndpointState.READY)
    services.scale_endpoint(endpoint=endpoint, user=None, replicas=2)
    assert not services.observe(endpoint, state="failed", generation=1)
    assert services.observe(endpoint, state="ready", generation=2) is False  # ready already
    assert fresh(endpoint).state == "ready"


def test_a_stopped_endpoint_stays_stopped_whatever_is_observed(world: Any) -> None:
    endpoint = services.stop_endpoint(endpoint=make_endpoint(world), user=None)
    assert not services.observe(endpoint, state="ready", replicas_ready=1)
    assert fresh(endpoint).state == "stopped"
    assert kinds(endpoint) == ["deployed", "stopped"]


def test_metrics_are_kept_on_the_row(world: Any) -> None:
    endpoint = make_endpoint(world)
    services.record_metrics(endpoint, requests_per_second=3.5, latency_p95_ms=40.0, error_rate=0.01)
    now = fresh(endpoint)
    assert (now.requests_per_second, now.latency_p95_ms, now.error_rate) == (3.5, 40.0, 0.01)
    assert now.metrics_at is not None
    assert kinds(endpoint) == ["deployed"]


# --- delivery ---------------------------------------------------------------------------------


def only_delivery(endpoint: Endpoint, action: str = "deploy") -> EndpointDelivery:
    return EndpointDelivery.objects.for_workspace(endpoint.workspace_id).get(
        endpoint=endpoint, action=action
    )


def test_a_delivery_calls_the_backend_outside_any_transaction(world: Any, monkeypatch: Any) -> None:
    endpoint = make_endpoint(world)
    row = only_delivery(endpoint)
    depths: list[bool] = []

    class Watching(fakes.FakeEndpoints):
        def deploy(self, endpoint: Endpoint) -> None:
            # Inside the test's own transaction (and its savepoint) only: none of delivery's.
            depths.append(len(connection.savepoint_ids) <= 1)
            super().deploy(endpoint)

    assert delivery.deliver(row.pk, backend_for=lambda e: Watching())
    assert fakes.CALLS == [("deploy", "chat", 1)]
    assert depths == [True]
    row.refresh_from_db()
    assert row.delivered_at is not None
    assert row.tries == 1
    assert row.claimed_at is None
    # Delivered once: a second call does nothing.
    assert not delivery.deliver(row.pk)
    assert fakes.CALLS == [("deploy", "chat", 1)]


def test_an_older_generations_deployment_is_not_delivered(world: Any) -> None:
    endpoint = make_endpoint(world, state=EndpointState.READY)
    services.scale_endpoint(endpoint=endpoint, user=None, replicas=2)
    first, second = (
        EndpointDelivery.objects.for_workspace(world.alpha).filter(endpoint=endpoint).order_by("pk")
    )
    assert not delivery.deliver(first.pk)
    assert delivery.deliver(second.pk)
    assert fakes.CALLS == [("deploy", "chat", 2)]
    first.refresh_from_db()
    assert first.delivered_at is not None


def test_a_failing_backend_is_tried_again_then_the_endpoint_fails(
    world: Any, settings: Any
) -> None:
    settings.TAU_DELIVERY_MAX_TRIES = 2
    endpoint = make_endpoint(world)
    row = only_delivery(endpoint)
    fakes.BEHAVIOUR.fail_with = RuntimeError("the cluster said no")
    assert not delivery.deliver(row.pk)
    row.refresh_from_db()
    assert row.tries == 1
    assert row.given_up_at is None
    assert "the cluster said no" in row.last_error
    EndpointDelivery.objects.for_workspace(world.alpha).filter(pk=row.pk).update(
        next_try_at=row.created_at
    )
    assert not delivery.deliver(row.pk)
    row.refresh_from_db()
    assert row.given_up_at is not None
    failed = fresh(endpoint)
    assert failed.state == "failed"
    assert failed.state_reason == (
        "It could not be deployed on the local backend (2 tries): the cluster said no"
    )
    assert kinds(endpoint) == ["deployed", "state"]
    assert verify_event_chain(endpoint)


def test_the_reconciler_finds_what_was_not_delivered(world: Any) -> None:
    endpoint = make_endpoint(world)
    row = only_delivery(endpoint)
    assert delivery.due_deliveries(grace_seconds=0) == [row.pk]
    from serving.tasks import reconcile_deliveries

    EndpointDelivery.objects.for_workspace(world.alpha).filter(pk=row.pk).update(
        created_at=row.created_at.replace(year=2020), next_try_at=row.created_at.replace(year=2020)
    )
    assert reconcile_deliveries() == 1
    assert delivery.due_deliveries(grace_seconds=0) == []
