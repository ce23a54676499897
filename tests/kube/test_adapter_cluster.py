"""The Kubernetes adapter against the real control plane (deploy/cluster: kube-apiserver, Kueue
with its webhooks, KubeRay's CRDs, RBAC, fake nodes).

What is proven here, with the real API server deciding:

* server-side apply creates, a second identical apply writes nothing (``resourceVersion``
  unchanged), a changed body is applied and a field TauGrid stops sending is removed; a hand
  edit by another field manager is a Conflict without ``force`` and taken back with it;
* apply never owns ``spec.suspend``: not when the body carries it (Kueue's webhook decides at
  create), and not after Kueue admitted the Job — a re-apply leaves it running;
* a Kueue webhook refusal is a RefusedByWebhook with Kueue's own message and nothing is stored;
  a CRD schema (CEL) refusal is an Invalid that is not a webhook's;
* get of a missing object is NotFound; an unserved kind is UnknownKind; delete is idempotent
  on request; lists filter by label selector across pages;
* a ServiceAccount without RBAC (impersonated) gets Forbidden, and SelfSubjectAccessReview
  says no to it and yes to the admin; a wrong token is Unauthorized and never in a message;
* the served versions of Kueue's and KubeRay's CRDs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import kube as adapter
import kube.api as kube_api
from kube import KubeClient, new_api_client
from tests.cluster.kueue_objects import KUEUE, batch_job, queue_setup
from tests.cluster.plugin import Kube, KubeCluster, wait_until

pytestmark = pytest.mark.cluster

NOBODY = "system:serviceaccount:x:y"


@pytest.fixture(scope="module")
def admin(kube_cluster: KubeCluster) -> Iterator[KubeClient]:
    """The adapter with the test cluster's admin kubeconfig (as TAU_KUBECONFIG would give)."""
    client = KubeClient(new_api_client(kube_cluster.kubeconfig))
    yield client
    client.close()


@pytest.fixture
def namespace(kube: Kube) -> str:
    """A fresh namespace, deleted (with everything in it) after the test."""
    return kube.namespace("kube-adapter")


@pytest.fixture
def cluster_scoped(admin: KubeClient) -> Iterator[list[tuple[str, str, str]]]:
    """(apiVersion, kind, name) of cluster-scoped objects to delete after the test."""
    created: list[tuple[str, str, str]] = []
    yield created
    for api_version, kind, name in created:
        admin.delete(api_version, kind, name, missing_ok=True)


def config_map(name: str, namespace: str, data: dict[str, str], **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": data,
    }


def owners(obj: dict[str, Any], *path: str) -> set[tuple[str, str]]:
    """(manager, operation) of every managedFields entry that owns the field at `path`
    (e.g. "spec", "suspend")."""
    found = set()
    for entry in obj["metadata"].get("managedFields") or []:
        fields = entry.get("fieldsV1") or {}
        for step in path:
            fields = fields.get(f"f:{step}")
            if fields is None:
                break
        else:
            found.add((entry["manager"], entry["operation"]))
    return found


# ---------------------------------------------------------------------------------------------
# Server-side apply
# ---------------------------------------------------------------------------------------------


def test_apply_creates_then_a_same_apply_writes_nothing_and_a_change_applies(
    admin: KubeClient, namespace: str
) -> None:
    body = config_map("settings", namespace, {"a": "1", "b": "2"}, team="alpha")
    created = admin.apply(body)
    assert created["data"] == {"a": "1", "b": "2"}
    assert created["metadata"]["uid"]
    version = created["metadata"]["resourceVersion"]
    assert owners(created, "data", "a") == {("taugrid", "Apply")}

    again = admin.apply(body)
    assert again["metadata"]["resourceVersion"] == version, "an unchanged apply was written"
    assert admin.get("v1", "ConfigMap", "settings", namespace)["metadata"]["resourceVersion"] == (
        version
    )

    changed = admin.apply(config_map("settings", namespace, {"a": "1", "c": "3"}, team="alpha"))
    assert changed["metadata"]["resourceVersion"] != version
    # `b` was TauGrid's and is no longer sent: server-side apply removes it.
    assert changed["data"] == {"a": "1", "c": "3"}


def test_apply_takes_back_a_hand_edit_only_when_forced(admin: KubeClient, namespace: str) -> None:
    admin.apply(config_map("tuned", namespace, {"limit": "4"}))
    hand = KubeClient(admin.api, field_manager="kubectl-edit")
    hand.apply(config_map("tuned", namespace, {"limit": "99"}))

    with pytest.raises(adapter.Conflict) as raised:
        admin.apply(config_map("tuned", namespace, {"limit": "4"}), force=False)
    assert raised.value.status == 409
    assert "kubectl-edit" in raised.value.message

    repaired = admin.apply(config_map("tuned", namespace, {"limit": "4"}))
    assert repaired["data"] == {"limit": "4"}
    assert owners(repaired, "data", "limit") == {("taugrid", "Apply")}


def test_a_dry_run_apply_stores_nothing(admin: KubeClient, namespace: str) -> None:
    shown = admin.apply(config_map("draft", namespace, {"a": "1"}), dry_run=True)
    assert shown["data"] == {"a": "1"}
    with pytest.raises(adapter.NotFound):
        admin.get("v1", "ConfigMap", "draft", namespace)


def test_a_kueue_object_is_applied_once_and_changed_in_place(
    admin: KubeClient, kube: Kube, namespace: str, cluster_scoped: list[tuple[str, str, str]]
) -> None:
    name = kube.unique("adapter-cq")
    cluster_scoped.append((KUEUE, "ClusterQueue", name))

    def queue(cpus: str) -> dict[str, Any]:
        return {
            "apiVersion": KUEUE,
            "kind": "ClusterQueue",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "taugrid"}},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [
                            {
                                "name": "default",
                                "resources": [{"name": "cpu", "nominalQuota": cpus}],
                            }
                        ],
                    }
                ],
            },
        }

    first = admin.apply(queue("4"))
    assert first["metadata"]["generation"] == 1
    # Kueue's controller writes status (and a finalizer) on its own: the spec's generation is
    # what an unchanged apply must leave alone.
    assert admin.apply(queue("4"))["metadata"]["generation"] == 1
    raised = admin.apply(queue("8"))
    assert raised["metadata"]["generation"] == 2
    quota = raised["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"]
    assert str(quota) == "8"


# ---------------------------------------------------------------------------------------------
# spec.suspend belongs to Kueue
# ---------------------------------------------------------------------------------------------


def test_apply_never_owns_spec_suspend_of_a_new_job(admin: KubeClient, namespace: str) -> None:
    """A body that says `suspend: false` does not start a Kueue-labelled Job: the field is not
    sent, Kueue's webhook suspends the Job on create, and TauGrid owns none of it."""
    body = batch_job("waits", namespace, "no-such-queue")
    body["spec"]["suspend"] = False
    job = admin.apply(body)
    assert job["spec"]["suspend"] is True, "Kueue's webhook should have suspended the Job"
    assert ("taugrid", "Apply") in owners(job, "spec", "template")
    assert not any(manager == "taugrid" for manager, _ in owners(job, "spec", "suspend"))

    relabelled = batch_job("waits", namespace, "no-such-queue")
    relabelled["metadata"]["labels"]["taugrid.io/attempt"] = "1"
    job = admin.apply(relabelled)
    assert job["metadata"]["labels"]["taugrid.io/attempt"] == "1"
    assert job["spec"]["suspend"] is True
    assert not any(manager == "taugrid" for manager, _ in owners(job, "spec", "suspend"))


def test_a_reapply_leaves_an_admitted_job_running(
    admin: KubeClient, kube: Kube, cluster_scoped: list[tuple[str, str, str]]
) -> None:
    """The case stripping exists for: Kueue unsuspended the Job; TauGrid applies it again (a
    label change, a drift repair) with `suspend: true` in its rendered body; it keeps running."""
    namespace, _, _ = queue_setup(kube, "adapter-admit", gpus=0)
    body = batch_job("runs", namespace, "team", pod_annotations={"taugrid.io/test-duration": "60s"})
    admin.apply(body)

    def admitted() -> dict[str, Any] | None:
        job = admin.get("batch/v1", "Job", "runs", namespace)
        return job if job["spec"].get("suspend") is False else None

    job = wait_until("Kueue to admit (unsuspend) the Job", admitted, timeout=60)
    kueue_owned = owners(job, "spec", "suspend")
    assert kueue_owned
    assert not any(manager == "taugrid" for manager, _ in kueue_owned)

    body["spec"]["suspend"] = True
    body["metadata"]["labels"]["taugrid.io/attempt"] = "1"
    again = admin.apply(body)
    assert again["metadata"]["labels"]["taugrid.io/attempt"] == "1"
    assert again["spec"]["suspend"] is False, "the re-apply suspended an admitted Job"
    assert owners(again, "spec", "suspend") == kueue_owned


# ---------------------------------------------------------------------------------------------
# Refusals and errors
# ---------------------------------------------------------------------------------------------


def invalid_queue(name: str, quota: dict[str, str], cohort: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["cpu"],
                "flavors": [{"name": "default", "resources": [{"name": "cpu", **quota}]}],
            }
        ],
    }
    if cohort:
        spec["cohortName"] = cohort
    return {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


@pytest.mark.parametrize(
    ("quota", "kueue_says"),
    [
        (
            {"nominalQuota": "4", "lendingLimit": "9"},
            'lendingLimit: Invalid value: "9": must be less than or equal to the nominalQuota',
        ),
        (
            {"nominalQuota": "-1"},
            'nominalQuota: Invalid value: "-1": must be greater than or equal to 0',
        ),
    ],
)
def test_a_kueue_webhook_refusal_carries_kueues_message(
    admin: KubeClient,
    kube: Kube,
    cluster_scoped: list[tuple[str, str, str]],
    quota: dict[str, str],
    kueue_says: str,
) -> None:
    name = kube.unique("adapter-bad")
    cluster_scoped.append((KUEUE, "ClusterQueue", name))
    body = invalid_queue(name, quota, cohort="adapter-cohort")
    for write in (admin.apply, admin.create):
        with pytest.raises(adapter.RefusedByWebhook) as raised:
            write(body)
        refusal = raised.value
        assert refusal.webhook == "vclusterqueue.kb.io"
        assert kueue_says in refusal.webhook_message
        assert refusal.message.startswith('admission webhook "vclusterqueue.kb.io" denied')
        assert refusal.status == 403  # controller-runtime's Denied; not an RBAC matter
        assert not isinstance(refusal, adapter.Forbidden)
    with pytest.raises(adapter.NotFound):
        admin.get(KUEUE, "ClusterQueue", name)


def test_a_schema_refusal_is_invalid_but_no_webhooks(
    admin: KubeClient, kube: Kube, cluster_scoped: list[tuple[str, str, str]]
) -> None:
    name = kube.unique("adapter-cel")
    cluster_scoped.append((KUEUE, "ClusterQueue", name))
    # Kueue's CRD has a CEL rule for this one: the API server refuses before any webhook.
    body = invalid_queue(name, {"nominalQuota": "4", "borrowingLimit": "2"}, cohort=None)
    with pytest.raises(adapter.Invalid) as raised:
        admin.apply(body)
    assert not isinstance(raised.value, adapter.RefusedByWebhook)
    assert raised.value.status == 422
    assert "borrowingLimit must be nil when cohort is empty" in raised.value.message

    # A flavor listed twice: the apply patch cannot even be typed (the API server says 500).
    twice = invalid_queue(name, {"nominalQuota": "4"}, cohort=None)
    group = twice["spec"]["resourceGroups"][0]
    group["flavors"].append(dict(group["flavors"][0]))
    with pytest.raises(adapter.Invalid) as by_apply:
        admin.apply(twice)
    assert 'duplicate entries for key [name="default"]' in by_apply.value.message
    with pytest.raises(adapter.Invalid) as by_create:
        admin.create(twice)
    assert by_create.value.status == 422
    assert "Duplicate value" in by_create.value.message


def test_get_of_a_missing_object_is_not_found(admin: KubeClient, namespace: str) -> None:
    with pytest.raises(adapter.NotFound) as raised:
        admin.get("v1", "ConfigMap", "absent", namespace)
    assert raised.value.status == 404
    assert raised.value.reason == "NotFound"
    assert raised.value.message == 'configmaps "absent" not found'
    with pytest.raises(adapter.NotFound):
        admin.get("ray.io/v1", "RayJob", "absent", namespace)
    with pytest.raises(adapter.NotFound):
        admin.get(KUEUE, "ClusterQueue", "absent-adapter-queue")


def test_an_unserved_kind_is_unknown_not_missing(admin: KubeClient, namespace: str) -> None:
    with pytest.raises(adapter.UnknownKind) as raised:
        admin.get("kueue.x-k8s.io/v9", "ClusterQueue", "x")
    assert "kueue.x-k8s.io/v9" in raised.value.message
    assert not isinstance(raised.value, adapter.NotFound)
    with pytest.raises(adapter.UnknownKind):
        admin.delete("v1", "Gadget", "x", namespace, missing_ok=True)


def test_create_of_an_existing_object_is_a_conflict(admin: KubeClient, namespace: str) -> None:
    created = admin.create(config_map("once", namespace, {"a": "1"}))
    assert owners(created, "data", "a") == {("taugrid", "Update")}
    with pytest.raises(adapter.Conflict) as raised:
        admin.create(config_map("once", namespace, {"a": "1"}))
    assert raised.value.reason == "AlreadyExists"


def test_delete_is_idempotent_when_asked(admin: KubeClient, namespace: str) -> None:
    admin.apply(config_map("doomed", namespace, {"a": "1"}))
    assert admin.delete("v1", "ConfigMap", "doomed", namespace) is True
    with pytest.raises(adapter.NotFound):
        admin.get("v1", "ConfigMap", "doomed", namespace)
    assert admin.delete("v1", "ConfigMap", "doomed", namespace, missing_ok=True) is False
    with pytest.raises(adapter.NotFound):
        admin.delete("v1", "ConfigMap", "doomed", namespace)
    assert (
        admin.delete(
            KUEUE, "ClusterQueue", "never-was-adapter", propagation="Foreground", missing_ok=True
        )
        is False
    )


def test_list_by_label_selector_across_pages(
    admin: KubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube_api, "LIST_PAGE_SIZE", 2)
    for index in range(5):
        workspace = "alpha" if index % 2 == 0 else "beta"
        admin.apply(
            config_map(f"cm-{index}", namespace, {"i": str(index)}, **{"taugrid.io/ws": workspace})
        )

    alpha = admin.list("v1", "ConfigMap", namespace, label_selector="taugrid.io/ws=alpha")
    assert sorted(item["metadata"]["name"] for item in alpha) == ["cm-0", "cm-2", "cm-4"]
    assert all((item["apiVersion"], item["kind"]) == ("v1", "ConfigMap") for item in alpha)

    both = admin.list("v1", "ConfigMap", namespace, label_selector="taugrid.io/ws in (alpha,beta)")
    assert len(both) == 5
    everywhere = admin.list("v1", "ConfigMap", label_selector="taugrid.io/ws=beta")
    assert {(item["metadata"]["namespace"], item["metadata"]["name"]) for item in everywhere} == {
        (namespace, "cm-1"),
        (namespace, "cm-3"),
    }
    with pytest.raises(adapter.Invalid):
        admin.list("v1", "ConfigMap", namespace, label_selector="not a selector ((")


# ---------------------------------------------------------------------------------------------
# Identity: RBAC, SelfSubjectAccessReview, credentials
# ---------------------------------------------------------------------------------------------


def test_a_serviceaccount_without_rbac_is_forbidden_and_access_review_says_so(
    admin: KubeClient, kube_cluster: KubeCluster, namespace: str
) -> None:
    admin.apply(config_map("private", namespace, {"a": "1"}))
    nobody = KubeClient(new_api_client(kube_cluster.kubeconfig, impersonate_user=NOBODY))
    try:
        with pytest.raises(adapter.Forbidden) as raised:
            nobody.get("v1", "ConfigMap", "private", namespace)
        error = raised.value
        assert type(error) is adapter.Forbidden
        assert error.status == 403
        assert f'User "{NOBODY}" cannot get resource "configmaps"' in error.message
        with pytest.raises(adapter.Forbidden):
            nobody.apply(config_map("private", namespace, {"a": "2"}))
        with pytest.raises(adapter.Forbidden):
            nobody.list(KUEUE, "ClusterQueue")

        assert nobody.can_i("get", "configmaps", namespace=namespace).allowed is False
        assert nobody.can_i("create", "clusterqueues", group="kueue.x-k8s.io").allowed is False
    finally:
        nobody.close()
    assert admin.can_i("get", "configmaps", namespace=namespace).allowed is True
    decision = admin.can_i("create", "clusterqueues", group="kueue.x-k8s.io")
    assert decision.allowed is True
    assert admin.can_i("update", "jobs", group="batch", subresource="status").allowed is True


def test_a_rejected_token_is_unauthorized_and_never_shown(
    kube_cluster: KubeCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = "taugrid-test-token-do-not-print-4242"
    real = yaml.safe_load(kube_cluster.kubeconfig.read_text())
    real["users"] = [{"name": "intruder", "user": {"token": token}}]
    real["contexts"][0]["context"]["user"] = "intruder"
    config_file = tmp_path / "kubeconfig"
    config_file.write_text(yaml.safe_dump(real))

    caplog.set_level(logging.DEBUG)
    client = KubeClient(new_api_client(config_file))
    with pytest.raises(adapter.Unauthorized) as raised:
        client.get("v1", "Namespace", "default")
    error = raised.value
    assert error.status == 401
    assert isinstance(error, adapter.Forbidden)
    for shown in (error.message, str(error), repr(error), repr(client), caplog.text):
        assert token not in shown
    client.close()


def test_served_versions_of_kueue_and_kuberay(admin: KubeClient) -> None:
    queues = admin.served_versions("clusterqueues.kueue.x-k8s.io")
    assert "v1beta2" in queues
    assert "v1" in admin.served_versions("rayjobs.ray.io")
    assert "v1beta2" in admin.served_versions("workloads.kueue.x-k8s.io")
    with pytest.raises(adapter.NotFound):
        admin.served_versions("widgets.example.org")


def test_the_shared_client_from_tau_kubeconfig(
    kube_cluster: KubeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAU_KUBECONFIG", str(kube_cluster.kubeconfig))
    adapter.reset_client()
    try:
        shared = adapter.client()
        assert shared is adapter.client()
        assert shared.get("v1", "Namespace", "default")["metadata"]["name"] == "default"
        assert shared.get_path("/version")["gitVersion"].startswith("v1.")
    finally:
        adapter.reset_client()
