"""The one list of the portal's permissions and the RBAC shipped from it (deploy/rbac/): the
file is the list, rendered, so they cannot drift; no wildcard anywhere; the decisions the
list's docstring explains hold. That the list is *sufficient* is proven on the test cluster
(tests/executors/kubernetes/test_cluster_check.py: every operation, as a ServiceAccount bound
only to this role)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from executors.kubernetes import cluster_check
from executors.kubernetes import rbac as cluster_access
from executors.kubernetes.rbac import (
    CLUSTER_ROLE,
    LEADER_LEASE,
    PORTAL_NAMESPACE,
    PORTAL_SERVICE_ACCOUNT,
    REQUIRED,
    REQUIRED_CRDS,
    cluster_role,
    render_cluster_role,
)

REPO = Path(__file__).resolve().parents[3]
RBAC = REPO / "deploy" / "rbac"
REGENERATE = ".venv/bin/python -m executors.kubernetes.rbac > deploy/rbac/clusterrole.yaml"


def granted(group: str, resource: str) -> set[str]:
    return {
        verb
        for permission in REQUIRED
        if (permission.group, permission.rbac_resource) == (group, resource)
        for verb in permission.verbs
    }


def test_the_shipped_cluster_role_is_the_list_rendered() -> None:
    shipped = (RBAC / "clusterrole.yaml").read_text()
    assert shipped == render_cluster_role(), f"deploy/rbac/clusterrole.yaml is stale: {REGENERATE}"
    # And what kubectl reads from it is exactly the list, one rule per permission.
    assert yaml.safe_load(shipped) == cluster_role()
    rules = yaml.safe_load(shipped)["rules"]
    assert len(rules) == len(REQUIRED)
    for permission, rule in zip(REQUIRED, rules, strict=True):
        assert rule["apiGroups"] == [permission.group]
        assert rule["verbs"] == list(permission.verbs)


def test_no_wildcard_in_the_list_or_the_files() -> None:
    for permission in REQUIRED:
        values = [permission.group, permission.resource, permission.subresource or ""]
        values += [*permission.verbs, *permission.resource_names]
        assert not any("*" in value for value in values), permission
        assert permission.verbs, permission
        assert len(set(permission.verbs)) == len(permission.verbs), permission
    for path in RBAC.glob("*.yaml"):
        for document in yaml.safe_load_all(path.read_text()):
            for rule in document.get("rules") or []:
                for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                    assert "*" not in "".join(rule.get(key) or []), (path.name, rule)


def test_each_permission_says_why_and_appears_once() -> None:
    keys = [(p.group, p.rbac_resource, p.resource_names) for p in REQUIRED]
    assert len(keys) == len(set(keys))
    for permission in REQUIRED:
        assert len(permission.why) > 20, permission


def test_the_decisions_hold() -> None:
    # Namespaces: deleted, but only those TauGrid created (namespace-guard.yaml, below).
    assert {"create", "patch", "delete"} <= granted("", "namespaces")
    # Secrets by name only: the portal cannot enumerate them.
    assert granted("", "secrets") == {"get", "create", "patch", "delete"}
    # Pods are read, never deleted (cancel deletes the job; the garbage collector, the pods).
    assert granted("", "pods") == {"get", "list", "watch"}
    assert granted("", "pods/log") == {"get"}
    # Kueue's Workloads are Kueue's: read only.
    assert granted("kueue.x-k8s.io", "workloads") == {"get", "list", "watch"}
    # Nodes: read, and patch for cordon; never create, update or delete.
    assert granted("", "nodes") == {"get", "list", "watch", "patch"}
    # Leases: get/update of the watcher's Lease only; create is unavoidably by any name.
    leases = [p for p in REQUIRED if p.resource == "leases"]
    assert {(p.verbs, p.resource_names) for p in leases} == {
        (("create",), ()),
        (("get", "update"), (LEADER_LEASE,)),
    }
    # CRDs: get, of exactly the ones cluster_check reads.
    (crds,) = [p for p in REQUIRED if p.resource == "customresourcedefinitions"]
    assert crds.verbs == ("get",)
    assert set(crds.resource_names) == set(REQUIRED_CRDS)


def test_access_checks_ask_once_per_verb_and_named_object() -> None:
    questions = list(cluster_access.access_checks())
    expected = sum(len(p.verbs) * max(1, len(p.resource_names)) for p in REQUIRED)
    assert len(questions) == expected == len(set(questions))
    assert (REQUIRED[0], "get", None) in questions
    named = [q for q in questions if q[0].resource == "customresourcedefinitions"]
    assert {name for _, _, name in named} == set(REQUIRED_CRDS)


def test_the_binding_gives_the_role_to_the_portal_serviceaccount() -> None:
    documents: list[dict[str, Any]] = list(yaml.safe_load_all((RBAC / "binding.yaml").read_text()))
    by_kind = {document["kind"]: document for document in documents}
    assert [document["kind"] for document in documents] == [
        "Namespace",
        "ServiceAccount",
        "ClusterRoleBinding",
    ], "the Namespace first: kubectl applies a file's documents in order"
    assert by_kind["Namespace"]["metadata"]["name"] == PORTAL_NAMESPACE
    assert by_kind["ServiceAccount"]["metadata"] == {
        "name": PORTAL_SERVICE_ACCOUNT,
        "namespace": PORTAL_NAMESPACE,
        "labels": by_kind["ServiceAccount"]["metadata"]["labels"],
    }
    binding = by_kind["ClusterRoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": CLUSTER_ROLE,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": PORTAL_SERVICE_ACCOUNT, "namespace": PORTAL_NAMESPACE}
    ]


def test_install_versions_named_in_fixes_are_the_ones_the_suite_runs() -> None:
    pinned = dict(
        line.split("=", 1)
        for line in (REPO / "deploy" / "cluster" / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert pinned["KUEUE_VERSION"] == cluster_check.KUEUE_VERSION
    assert pinned["KUBERAY_VERSION"] == cluster_check.KUBERAY_VERSION


def test_the_namespace_guard_applies_to_the_portal_serviceaccount_only() -> None:
    policy, binding = yaml.safe_load_all((RBAC / "namespace-guard.yaml").read_text())
    assert policy["kind"] == "ValidatingAdmissionPolicy"
    assert binding["kind"] == "ValidatingAdmissionPolicyBinding"
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["resources"], rule["operations"]) == (["namespaces"], ["UPDATE", "DELETE"])
    (condition,) = policy["spec"]["matchConditions"]
    user = f"system:serviceaccount:{PORTAL_NAMESPACE}:{PORTAL_SERVICE_ACCOUNT}"
    assert condition["expression"] == f"request.userInfo.username == '{user}'"
    # The workspace sync's record of a namespace it created (executors/kubernetes/kueue.py).
    assert "'taugrid.io/created-by'" in policy["spec"]["variables"][0]["expression"]


def test_the_portals_namespace_is_the_one_tenancy_refuses_to_workspaces() -> None:
    from workspaces.models import PORTAL_NAMESPACE as refused
    from workspaces.models import namespace_refusal

    assert refused == PORTAL_NAMESPACE
    assert namespace_refusal(PORTAL_NAMESPACE) is not None
