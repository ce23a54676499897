"""What an endpoint's objects on the cluster say about it, in the endpoint's states and in
words for people: its RayService (KubeRay's status of the Ray clusters it runs and of Ray
Serve's application on them) and the Kueue Workload of the Ray cluster KubeRay made for it.

A pure function of the objects, like ``executors.kubernetes.status`` for runs: the watcher
reads the objects and hands the result to ``serving.services.observe``; tests feed it the
shapes KubeRay v1.6 and Kueue v0.17 write (tests/executors/kubernetes/test_endpoint_status.py).

The states (the serving core's), from the RayService's status:

* ``deploying`` — no Ray cluster serves yet: waiting for Kueue (its reason in plain words, as
  a queued run says it), admitted and starting, or Ray Serve deploying the application;
* ``ready`` — KubeRay's ``Ready`` condition: requests reach at least one replica, and the
  application is ``RUNNING``;
* ``updating`` — ``Ready`` while a newer Ray cluster is brought up beside the serving one
  (``UpgradeInProgress``), or while KubeRay has not yet seen the latest change;
* ``unhealthy`` — the application or a deployment is ``UNHEALTHY``, or no replica answers any
  more (``ZeroServeEndpoints`` after it served), with Ray Serve's own message;
* ``failed`` — KubeRay refused the RayService (``ValidationFailed``) or Ray Serve could not
  deploy the application (``DEPLOY_FAILED``: an import path that does not exist, an exception
  in the constructor): the message is Ray Serve's, and nothing retries it.

Replicas ready are the Ray cluster's ready workers: each worker holds one replica
(``render_endpoint``), so the two are the same for a fixed number of replicas; with
autoscaling they are the workers that could hold one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from executors.kubernetes.status import waiting_reason

Body = Mapping[str, Any]

DEPLOYING: Final = "deploying"
READY: Final = "ready"
UPDATING: Final = "updating"
UNHEALTHY: Final = "unhealthy"
FAILED: Final = "failed"

#: The longest message of Ray Serve's kept in a reason (a traceback is long).
MESSAGE_LIMIT: Final = 600


@dataclass(frozen=True)
class EndpointObservation:
    state: str
    reason: str
    replicas_ready: int


def _status(obj: Body | None) -> Mapping[str, Any]:
    return (obj or {}).get("status") or {}


def _conditions(obj: Body | None) -> dict[str, Mapping[str, Any]]:
    return {str(entry.get("type")): entry for entry in _status(obj).get("conditions") or []}


def _true(obj: Body | None, kind: str) -> bool:
    return str(_conditions(obj).get(kind, {}).get("status")) == "True"


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


def _application(service_status: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    applications = service_status.get("applicationStatuses") or {}
    found: Mapping[str, Any] = applications.get(name) or {}
    return found


def _unhealthy_words(application: Mapping[str, Any]) -> str:
    messages = [str(application.get("message") or "")]
    for deployment, status in sorted((application.get("serveDeploymentStatuses") or {}).items()):
        if status.get("status") == "UNHEALTHY" and status.get("message"):
            messages.append(f"{deployment}: {status['message']}")
    said = "; ".join(message for message in messages if message)
    return _short(said or "Ray Serve reports the application unhealthy.")


def observe_endpoint(
    service: Body | None, *, application: str, workload: Body | None = None
) -> EndpointObservation | None:
    """The endpoint's state from its RayService (``application`` is the Serve application's
    name, the endpoint's) and its Ray cluster's Kueue Workload; None while there is no
    RayService to read (not created yet, or deleted: the backend knows which)."""
    if service is None:
        return None
    status = _status(service)
    active = status.get("activeServiceStatus") or {}
    pending = status.get("pendingServiceStatus") or {}
    ready_workers = int((active.get("rayClusterStatus") or {}).get("readyWorkerReplicas") or 0)
    ready = _conditions(service).get("Ready") or {}

    if ready.get("reason") == "ValidationFailed":
        return EndpointObservation(
            FAILED, _short(f"KubeRay refused the RayService: {ready.get('message') or ''}"), 0
        )
    for which in (pending, active):
        app = _application(which, application)
        if app.get("status") == "DEPLOY_FAILED":
            message = _short(str(app.get("message") or "no message"))
            return EndpointObservation(
                FAILED, f"Ray Serve could not deploy the application: {message}", ready_workers
            )

    app = _application(active, application)
    generation = int((service.get("metadata") or {}).get("generation") or 0)
    seen = int(status.get("observedGeneration") or 0)
    if str(ready.get("status")) == "True":
        if app.get("status") == "UNHEALTHY":
            return EndpointObservation(UNHEALTHY, _unhealthy_words(app), ready_workers)
        if _true(service, "UpgradeInProgress") or pending.get("rayClusterName"):
            return EndpointObservation(
                UPDATING,
                "Serving from the current Ray cluster while the new one starts; requests move "
                "to it once it serves.",
                ready_workers,
            )
        if seen < generation:
            return EndpointObservation(
                UPDATING, "Serving while KubeRay takes in the change.", ready_workers
            )
        return EndpointObservation(READY, "", ready_workers)

    if app.get("status") == "UNHEALTHY":
        return EndpointObservation(UNHEALTHY, _unhealthy_words(app), ready_workers)
    if ready.get("reason") == "ZeroServeEndpoints" and app.get("status") == "RUNNING":
        return EndpointObservation(
            UNHEALTHY, "No replica answers: Ray Serve's proxies are not ready.", ready_workers
        )
    # Not serving yet: where it is on its way.
    if workload is not None and not _true(workload, "Admitted"):
        waiting = waiting_reason(workload)
        return EndpointObservation(
            DEPLOYING, waiting or "Waiting for Kueue to admit its Ray cluster.", 0
        )
    if app.get("status") == "DEPLOYING":
        return EndpointObservation(
            DEPLOYING, "Ray Serve is deploying the application (starting its replicas).", 0
        )
    if workload is None and (active.get("rayClusterName") or pending.get("rayClusterName")):
        # KubeRay named its Ray cluster, and Kueue has not (yet) made its Workload: nothing
        # is admitted, whatever comes next.
        return EndpointObservation(
            DEPLOYING, "KubeRay made its Ray cluster; waiting for Kueue to take it in.", 0
        )
    if workload is not None:
        return EndpointObservation(
            DEPLOYING,
            "Admitted: starting the Ray cluster (fetching the code, staging the model), then "
            "Ray Serve.",
            ready_workers,
        )
    return EndpointObservation(DEPLOYING, "KubeRay is creating the Ray cluster.", 0)
