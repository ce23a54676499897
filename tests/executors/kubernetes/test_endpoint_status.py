"""An endpoint's state from its RayService and its Ray cluster's Workload
(executors/kubernetes/endpoint_status.py), on the status shapes KubeRay v1.6 and Kueue v0.17
write: waiting for quota, starting, deploying, ready, an upgrade, unhealthy, refused, failed.

The shapes come from KubeRay's types (apis/ray/v1/rayservice_types.go: conditions ``Ready``
and ``UpgradeInProgress``, ``activeServiceStatus``/``pendingServiceStatus`` with
``applicationStatuses`` and ``rayClusterStatus``) and Kueue's Workload conditions; the
cluster tests (test_render_endpoint_cluster.py) show the real Kueue writing the waiting one.
"""

from __future__ import annotations

from typing import Any

import pytest

from executors.kubernetes.endpoint_status import (
    DEPLOYING,
    FAILED,
    MESSAGE_LIMIT,
    READY,
    UNHEALTHY,
    UPDATING,
    observe_endpoint,
)

APP = "serve-cpu"


def service(
    *,
    ready: tuple[str, str] | None = None,
    upgrading: bool = False,
    active: dict[str, Any] | None = None,
    pending: dict[str, Any] | None = None,
    generation: int = 1,
    observed: int = 1,
    message: str = "",
) -> dict[str, Any]:
    conditions = []
    if ready is not None:
        conditions.append(
            {"type": "Ready", "status": ready[0], "reason": ready[1], "message": message}
        )
    if upgrading:
        conditions.append({"type": "UpgradeInProgress", "status": "True", "reason": "x"})
    status: dict[str, Any] = {"conditions": conditions, "observedGeneration": observed}
    if active is not None:
        status["activeServiceStatus"] = active
    if pending is not None:
        status["pendingServiceStatus"] = pending
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": APP, "generation": generation},
        "status": status,
    }


def cluster_status(
    app_status: str | None, *, workers: int = 0, message: str = "", deployments: Any = None
) -> dict[str, Any]:
    found: dict[str, Any] = {
        "rayClusterName": f"{APP}-raycluster-x7k2q",
        "rayClusterStatus": {"readyWorkerReplicas": workers},
    }
    if app_status is not None:
        found["applicationStatuses"] = {
            APP: {
                "status": app_status,
                "message": message,
                "serveDeploymentStatuses": deployments or {},
            }
        }
    return found


def workload(*, admitted: bool, message: str = "") -> dict[str, Any]:
    conditions = [
        {
            "type": "QuotaReserved",
            "status": "True" if admitted else "False",
            "reason": "QuotaReserved" if admitted else "Pending",
            "message": message,
        }
    ]
    if admitted:
        conditions.append({"type": "Admitted", "status": "True", "reason": "Admitted"})
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "status": {"conditions": conditions},
    }


def test_nothing_to_read_is_none() -> None:
    assert observe_endpoint(None, application=APP) is None


def test_waiting_for_quota_says_kueue_s_reason_in_plain_words() -> None:
    waiting = workload(
        admitted=False,
        message="couldn't assign flavors to pod set workers: insufficient quota for "
        "nvidia.com/gpu in flavor h100, previously considered podsets requests (0) + current "
        "podset request (3) > maximum capacity (2)",
    )
    seen = observe_endpoint(
        service(ready=("False", "Initializing")), application=APP, workload=waiting
    )
    assert seen is not None
    assert seen.state == DEPLOYING
    assert "GPU" in seen.reason
    assert seen.replicas_ready == 0


def test_a_ray_cluster_without_its_workload_yet_is_not_called_admitted() -> None:
    seen = observe_endpoint(
        service(ready=("False", "Initializing"), pending=cluster_status(None)),
        application=APP,
        workload=None,
    )
    assert seen is not None
    assert seen.state == DEPLOYING
    assert "Admitted" not in seen.reason
    assert "waiting for Kueue" in seen.reason


def test_admitted_then_starting_then_deploying_then_ready() -> None:
    admitted = workload(admitted=True)
    starting = observe_endpoint(
        service(ready=("False", "Initializing"), pending=cluster_status(None)),
        application=APP,
        workload=admitted,
    )
    assert starting is not None
    assert (starting.state, starting.reason.split(":")[0]) == (DEPLOYING, "Admitted")
    deploying = observe_endpoint(
        service(ready=("False", "Initializing"), active=cluster_status("DEPLOYING", workers=1)),
        application=APP,
        workload=admitted,
    )
    assert deploying is not None
    assert deploying.state == DEPLOYING
    assert "Ray Serve is deploying" in deploying.reason
    ready = observe_endpoint(
        service(
            ready=("True", "NonZeroServeEndpoints"), active=cluster_status("RUNNING", workers=2)
        ),
        application=APP,
        workload=admitted,
    )
    assert ready is not None
    assert (ready.state, ready.reason, ready.replicas_ready) == (READY, "", 2)


def test_an_upgrade_serves_from_the_old_cluster_and_says_so() -> None:
    upgrading = observe_endpoint(
        service(
            ready=("True", "NonZeroServeEndpoints"),
            upgrading=True,
            active=cluster_status("RUNNING", workers=2),
            pending=cluster_status("DEPLOYING"),
            generation=3,
            observed=3,
        ),
        application=APP,
    )
    assert upgrading is not None
    assert upgrading.state == UPDATING
    assert upgrading.replicas_ready == 2
    unseen = observe_endpoint(
        service(
            ready=("True", "NonZeroServeEndpoints"),
            active=cluster_status("RUNNING", workers=2),
            generation=4,
            observed=3,
        ),
        application=APP,
    )
    assert unseen is not None
    assert unseen.state == UPDATING


def test_unhealthy_carries_ray_serve_s_own_words() -> None:
    deployments = {
        "ReviewsClassifier": {
            "status": "UNHEALTHY",
            "message": "The deployment failed its health check 3 times.",
        }
    }
    seen = observe_endpoint(
        service(
            ready=("True", "NonZeroServeEndpoints"),
            active=cluster_status("UNHEALTHY", workers=1, deployments=deployments),
        ),
        application=APP,
    )
    assert seen is not None
    assert seen.state == UNHEALTHY
    assert "ReviewsClassifier: The deployment failed its health check 3 times." in seen.reason
    gone = observe_endpoint(
        service(ready=("False", "ZeroServeEndpoints"), active=cluster_status("RUNNING")),
        application=APP,
    )
    assert gone is not None
    assert gone.state == UNHEALTHY
    assert "No replica answers" in gone.reason


@pytest.mark.parametrize("where", ["active", "pending"])
def test_an_application_that_cannot_deploy_fails_with_ray_serve_s_message(where: str) -> None:
    failed = cluster_status(
        "DEPLOY_FAILED",
        message="Deploying application serve-cpu failed: ModuleNotFoundError: No module named "
        "'apps'" + " (traceback)" * 200,
    )
    shaped = (
        service(ready=("False", "Initializing"), active=failed)
        if where == "active"
        else service(ready=("False", "Initializing"), pending=failed)
    )
    seen = observe_endpoint(shaped, application=APP)
    assert seen is not None
    assert seen.state == FAILED
    assert seen.reason.startswith("Ray Serve could not deploy the application: Deploying")
    assert "No module named 'apps'" in seen.reason
    assert len(seen.reason) < MESSAGE_LIMIT + 60  # a traceback is cut, not stored whole


def test_a_rayservice_kuberay_refuses_fails() -> None:
    seen = observe_endpoint(
        service(
            ready=("False", "ValidationFailed"),
            message="The RayService spec is invalid: RayService name should be no more than 47",
        ),
        application=APP,
    )
    assert seen is not None
    assert seen.state == FAILED
    assert seen.reason.startswith("KubeRay refused the RayService: The RayService spec is")


def test_another_application_s_status_is_not_this_one_s() -> None:
    other = cluster_status("DEPLOY_FAILED", message="not ours")
    other["applicationStatuses"] = {"another": other["applicationStatuses"][APP]}
    seen = observe_endpoint(service(ready=("False", "Initializing"), active=other), application=APP)
    assert seen is not None
    assert seen.state == DEPLOYING
