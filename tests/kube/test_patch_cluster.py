"""``KubeClient.patch`` against the real API server (deploy/cluster): the three patch types do
what Kubernetes says they do, a patch never creates, a subresource is patched on its own, and a
body of the wrong shape is refused before anything is sent.

- merge (RFC 7386): the keys named are set, ``None`` removes one, the rest stays; a list is
  replaced whole;
- strategic merge: a list with a merge key (a Service's ports, by port) is merged;
- JSON patch (RFC 6902): operations, a failing ``test`` refuses the whole patch;
- ``subresource="status"``: a Node condition written through ``nodes/status`` as a node's own
  agents (node-problem-detector) write it, the others kept (the node is restored).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import kube as adapter
from kube import KubeClient, new_api_client
from tests.cluster.plugin import Kube, KubeCluster

pytestmark = pytest.mark.cluster

NOBODY = "system:serviceaccount:x:patcher"


@pytest.fixture(scope="module")
def admin(kube_cluster: KubeCluster) -> Iterator[KubeClient]:
    client = KubeClient(new_api_client(kube_cluster.kubeconfig))
    yield client
    client.close()


@pytest.fixture
def namespace(kube: Kube) -> str:
    return kube.namespace("kube-patch")


def config_map(name: str, namespace: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": {"team": "alpha"}},
        "data": data,
    }


def test_a_merge_patch_sets_and_removes_only_what_it_names(
    admin: KubeClient, namespace: str
) -> None:
    created = admin.create(config_map("settings", namespace, {"a": "1", "b": "2"}))
    patched = admin.patch(
        "v1",
        "ConfigMap",
        "settings",
        {"data": {"a": "9", "b": None, "c": "3"}},
        namespace=namespace,
    )
    assert patched["data"] == {"a": "9", "c": "3"}
    assert patched["metadata"]["labels"] == {"team": "alpha"}
    assert patched["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    stored = admin.get("v1", "ConfigMap", "settings", namespace)
    assert stored["data"] == {"a": "9", "c": "3"}
    managers = {entry["manager"] for entry in stored["metadata"]["managedFields"]}
    assert "taugrid" in managers


def test_a_patch_of_a_missing_object_is_not_found_and_creates_nothing(
    admin: KubeClient, namespace: str
) -> None:
    with pytest.raises(adapter.NotFound):
        admin.patch("v1", "ConfigMap", "nowhere", {"data": {"a": "1"}}, namespace=namespace)
    with pytest.raises(adapter.NotFound):
        admin.get("v1", "ConfigMap", "nowhere", namespace)


def test_strategic_merge_merges_a_keyed_list_where_merge_replaces_it(
    admin: KubeClient, namespace: str
) -> None:
    admin.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}]},
        }
    )
    merged = admin.patch(
        "v1",
        "Service",
        "web",
        {"spec": {"ports": [{"name": "metrics", "port": 9090}]}},
        namespace=namespace,
        patch_type="strategic",
    )
    assert sorted(port["port"] for port in merged["spec"]["ports"]) == [80, 9090]
    replaced = admin.patch(
        "v1",
        "Service",
        "web",
        {"spec": {"ports": [{"name": "https", "port": 443}]}},
        namespace=namespace,
        patch_type="merge",
    )
    assert [port["port"] for port in replaced["spec"]["ports"]] == [443]


def test_a_json_patch_applies_operations_and_a_failed_test_changes_nothing(
    admin: KubeClient, namespace: str
) -> None:
    admin.create(config_map("ops", namespace, {"a": "1"}))
    patched = admin.patch(
        "v1",
        "ConfigMap",
        "ops",
        [
            {"op": "replace", "path": "/data/a", "value": "2"},
            {"op": "add", "path": "/data/b", "value": "3"},
        ],
        namespace=namespace,
        patch_type="json",
    )
    assert patched["data"] == {"a": "2", "b": "3"}
    with pytest.raises(adapter.KubeError) as raised:
        admin.patch(
            "v1",
            "ConfigMap",
            "ops",
            [{"op": "test", "path": "/data/a", "value": "1"}, {"op": "remove", "path": "/data/b"}],
            namespace=namespace,
            patch_type="json",
        )
    assert raised.value.status in {409, 422}
    assert admin.get("v1", "ConfigMap", "ops", namespace)["data"] == {"a": "2", "b": "3"}


def test_a_status_subresource_patch_keeps_the_other_conditions(admin: KubeClient) -> None:
    """A condition added through nodes/status with a strategic merge (conditions merge by
    type), then removed the same way; the standard ones stay as they were."""
    before = admin.get("v1", "Node", "cpu-2")
    standard = {c["type"] for c in before["status"]["conditions"]}
    try:
        patched = admin.patch(
            "v1",
            "Node",
            "cpu-2",
            {
                "status": {
                    "conditions": [
                        {
                            "type": "TaugridPatchProbe",
                            "status": "True",
                            "reason": "Probe",
                            "message": "written by tests/kube/test_patch_cluster.py",
                            "lastHeartbeatTime": "2026-12-01T12:00:00Z",
                            "lastTransitionTime": "2026-12-01T12:00:00Z",
                        }
                    ]
                }
            },
            patch_type="strategic",
            subresource="status",
        )
        types = {c["type"] for c in patched["status"]["conditions"]}
        assert types == standard | {"TaugridPatchProbe"}
        # A status patch sent to the object itself is ignored for status: the subresource is
        # the only way in.
        admin.patch("v1", "Node", "cpu-2", {"metadata": {"labels": {"taugrid.io/probe": "1"}}})
        labelled = admin.get("v1", "Node", "cpu-2")
        assert labelled["metadata"]["labels"]["taugrid.io/probe"] == "1"
        assert "TaugridPatchProbe" in {c["type"] for c in labelled["status"]["conditions"]}
    finally:
        admin.patch(
            "v1",
            "Node",
            "cpu-2",
            {"status": {"conditions": [{"type": "TaugridPatchProbe", "$patch": "delete"}]}},
            patch_type="strategic",
            subresource="status",
        )
        admin.patch("v1", "Node", "cpu-2", {"metadata": {"labels": {"taugrid.io/probe": None}}})
    after = admin.get("v1", "Node", "cpu-2")
    assert {c["type"] for c in after["status"]["conditions"]} == standard
    assert "taugrid.io/probe" not in after["metadata"]["labels"]


def test_rbac_decides_a_patch(admin: KubeClient, kube_cluster: KubeCluster) -> None:
    nobody = KubeClient(new_api_client(kube_cluster.kubeconfig, impersonate_user=NOBODY))
    try:
        with pytest.raises(adapter.Forbidden) as raised:
            nobody.patch("v1", "Node", "cpu-2", {"spec": {"unschedulable": True}})
        assert f'User "{NOBODY}" cannot patch resource "nodes"' in raised.value.message
    finally:
        nobody.close()
    assert not admin.get("v1", "Node", "cpu-2")["spec"].get("unschedulable")


@pytest.mark.parametrize(
    ("body", "patch_type", "says"),
    [
        ([{"op": "remove", "path": "/data/a"}], "merge", "a merge patch is a mapping"),
        ({"data": {}}, "json", "a JSON patch is a list of operations"),
        ("data: {}", "json", "a JSON patch is a list of operations"),
        ({"data": {}}, "apply", "patch_type must be merge, strategic or json"),
    ],
)
def test_a_body_of_the_wrong_shape_is_refused_before_sending(
    admin: KubeClient, body: Any, patch_type: Any, says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        admin.patch("v1", "ConfigMap", "x", body, namespace="default", patch_type=patch_type)
