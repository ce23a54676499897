"""Is this cluster ready for TauGrid? The checks behind ``manage.py cluster_check``.

A platform team runs it before switching ``TAU_BACKEND`` to ``kubernetes`` (and after any
upgrade of Kueue, KubeRay or the portal's RBAC). Each check answers with a result and, when
something is wrong, one concrete thing to do:

1. **API server** — it answers (``/version``), and who the portal is to it
   (``SelfSubjectReview``). A failure here is the adapter's error type and message, and the
   other checks are skipped.
2. **CRDs** — Kueue's and KubeRay's CustomResourceDefinitions serve the versions TauGrid
   speaks (:data:`~executors.kubernetes.rbac.REQUIRED_CRDS`): Kueue ``v1beta2``, KubeRay
   ``ray.io/v1``.
3. **Visibility API** — Kueue's aggregated ``visibility.kueue.x-k8s.io/v1beta2`` is
   registered, lists both ``pendingworkloads`` subresources, and Kueue itself answers a
   request (for a ClusterQueue that does not exist: Kueue's own "not found" is an answer, and
   asking never depends on what queues exist).
4. **Permissions** — one ``SelfSubjectAccessReview`` per verb (and per object, where a rule
   names objects) of :data:`~executors.kubernetes.rbac.REQUIRED`; each permission with a
   missing verb is a row naming it, with the fix.
5. **Flavors** — each ResourceFlavor's node labels match at least one node; a flavor that
   names a GPU model matches nodes with allocatable ``nvidia.com/gpu``; a warning when every
   matching node has a taint the flavor does not tolerate (Kueue puts the flavor's
   tolerations on the pods it admits, so such pods would never schedule).
6. **GPU nodes** — some node has allocatable ``nvidia.com/gpu``. None is a *warning* while
   no flavor names a GPU model (CPU-only runs work, and GPU nodes often join after the
   portal is validated), and a *failure* once one does (the platform promised GPUs the
   cluster does not have).

Nothing here depends on ``TAU_BACKEND``: the client comes from ``TAU_KUBECONFIG`` (or the
command's ``--kubeconfig``) or the pod's ServiceAccount, as the adapter's does. The checks
take a :class:`~kube.KubeClient` and plain :class:`Flavor` values, so tests run them against
the test cluster, an impersonating client, or a fake.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import textwrap
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from executors.kubernetes.rbac import (
    CLUSTER_ROLE,
    KUEUE,
    REQUIRED,
    REQUIRED_CRDS,
    VISIBILITY,
    Permission,
    access_checks,
)
from kube import (
    AccessReview,
    Forbidden,
    KubeClient,
    KubeConfigError,
    KubeError,
    NotFound,
    Unauthorized,
    Unavailable,
    new_api_client,
)
from kube.errors import safe_address
from tau.k8s_names import GPU_RESOURCE
from tau.quantity import QuantityError, parse_quantity

__all__ = [
    "KUBERAY_VERSION",
    "KUEUE_VERSION",
    "Check",
    "Flavor",
    "Report",
    "Result",
    "check_cluster",
    "run_checks",
]

#: The versions the suite runs against (deploy/cluster/versions.env; a test keeps them equal),
#: named in the "install" fixes.
KUEUE_VERSION: Final = "v0.17.0"
KUBERAY_VERSION: Final = "v1.6.0"
#: Short timeouts: a check that hangs helps nobody, and every call here is small.
CHECK_TIMEOUT: Final = (5.0, 15.0)
#: Access reviews in flight at once (about 80 of them; sequential they take seconds on a
#: remote cluster).
REVIEW_WORKERS: Final = 8
VISIBILITY_VERSION: Final = "v1beta2"
#: A ClusterQueue name that no cluster has: Kueue's "not found" proves it answered.
VISIBILITY_PROBE: Final = "taugrid-cluster-check-probe"
#: Where the shipped permissions come from: the Helm chart's ClusterRole (the same rules), or
#: deploy/rbac/ for an installation without the chart.
RBAC_FIX: Final = (
    "helm upgrade TauGrid's release (its ClusterRole), or kubectl apply -f deploy/rbac/"
)

INSTALL: Final[dict[str, str]] = {
    KUEUE: (
        f"install Kueue {KUEUE_VERSION} (v0.16 or newer serves v1beta2): kubectl apply "
        "--server-side -f https://github.com/kubernetes-sigs/kueue/releases/download/"
        f"{KUEUE_VERSION}/manifests.yaml"
    ),
    "ray.io": (
        f"install the KubeRay operator {KUBERAY_VERSION} (v1.0 or newer serves ray.io/v1): "
        "helm repo add kuberay https://ray-project.github.io/kuberay-helm/ && helm install "
        f"kuberay-operator kuberay/kuberay-operator --version {KUBERAY_VERSION.lstrip('v')}"
    ),
}
PRODUCT: Final[dict[str, str]] = {KUEUE: "Kueue", "ray.io": "KubeRay"}


class Result(enum.StrEnum):
    OK = "ok"
    WARNING = "warning"
    FAILED = "FAILED"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Check:
    """One row of the report: what was checked, how it went, what was found, what to do."""

    check: str
    result: Result
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Flavor:
    """What the flavor check needs of a ResourceFlavor row."""

    name: str
    node_labels: Mapping[str, str]
    tolerations: Sequence[Mapping[str, Any]] = ()
    gpu_model: str = ""


@dataclass
class Report:
    server: str
    identity: str
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [check for check in self.checks if check.result is Result.FAILED]

    @property
    def ok(self) -> bool:
        return not self.failed

    def counts(self) -> dict[str, int]:
        counted: dict[str, int] = defaultdict(int)
        for check in self.checks:
            counted[check.result.value] += 1
        return dict(counted)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "server": self.server,
            "identity": self.identity,
            "counts": self.counts(),
            "checks": [asdict(check) for check in self.checks],
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    def table(self) -> str:
        """The checks as a text table (long cells wrapped), then one summary line."""
        return render_table(self)


# -- the checks ---------------------------------------------------------------------------------


def check_cluster(
    flavors: Iterable[Flavor],
    *,
    kubeconfig: str | os.PathLike[str] | None = None,
    impersonate_user: str | None = None,
) -> Report:
    """Build a client (``kubeconfig``, else ``TAU_KUBECONFIG``, else in-cluster; acting as
    ``impersonate_user`` if given), run every check, close the client."""
    try:
        api = new_api_client(kubeconfig, impersonate_user=impersonate_user)
    except KubeConfigError as error:
        report = Report(server="(not configured)", identity="(unknown)")
        report.checks.append(
            Check(
                "API server",
                Result.FAILED,
                _error(error),
                "set TAU_KUBECONFIG (or --kubeconfig) to the path of a kubeconfig, or run in a "
                "pod with a ServiceAccount",
            )
        )
        report.checks.append(_skipped_after_api())
        return report
    client = KubeClient(api, timeout=CHECK_TIMEOUT)
    try:
        return run_checks(client, flavors)
    finally:
        client.close()


def run_checks(kube: KubeClient, flavors: Iterable[Flavor]) -> Report:
    """Every check against ``kube``'s cluster, as ``kube``'s identity."""
    flavors = list(flavors)
    server = safe_address(str(kube.api.configuration.host))
    report = Report(server=server, identity="(unknown)")
    api_check = check_api_server(kube, report)
    report.checks.append(api_check)
    if api_check.result is Result.FAILED:
        report.checks.append(_skipped_after_api())
        return report
    report.checks.extend(check_crds(kube))
    report.checks.append(check_visibility(kube))
    report.checks.extend(check_permissions(kube, report.identity))
    nodes, node_error = _nodes(kube)
    report.checks.extend(check_flavors(flavors, nodes, node_error))
    report.checks.append(check_gpu_nodes(flavors, nodes, node_error))
    return report


def _skipped_after_api() -> Check:
    return Check(
        "everything else", Result.SKIPPED, "the API server must answer first", "fix the above"
    )


def check_api_server(kube: KubeClient, report: Report) -> Check:
    """``/version`` answers; the identity (when the cluster says) goes into ``report``."""
    try:
        version = kube.get_path("/version")
    except KubeError as error:
        return Check("API server", Result.FAILED, _error(error), _api_fix(error, report.server))
    # Not fatal: the permission check names selfsubjectreviews if that is why it failed.
    with contextlib.suppress(KubeError):
        report.identity = kube.whoami().username or "(unknown)"
    return Check(
        "API server",
        Result.OK,
        f"Kubernetes {version.get('gitVersion', '(version unknown)')} at {report.server}, "
        f"as {report.identity}",
    )


def _api_fix(error: KubeError, server: str) -> str:
    if isinstance(error, Unauthorized):
        return (
            f"the cluster refused the credentials: renew the token or certificate in "
            f"TAU_KUBECONFIG, or check the pod's ServiceAccount token ({server})"
        )
    if isinstance(error, Unavailable):
        return (
            f"check that the API server at {server} is up and reachable from this machine "
            "(address and port in TAU_KUBECONFIG, firewall, VPN)"
        )
    if isinstance(error, Forbidden):
        return "the identity may not read /version: grant the system:public-info-viewer role"
    return f"the API server at {server} answered an error: see the message"


def check_crds(kube: KubeClient, crds: Mapping[str, str] = REQUIRED_CRDS) -> list[Check]:
    """One failed row per CRD that is missing or does not serve its version; else one ok row
    per product."""
    # (product, group/version) -> the plurals that serve it
    served_ok: dict[tuple[str, str], list[str]] = defaultdict(list)
    failures: list[Check] = []
    for crd, version in crds.items():
        group = crd.partition(".")[2]
        product = PRODUCT.get(group, group)
        install = INSTALL.get(group, f"install the CRD {crd} in version {version}")
        name = f"{product} CRD {crd}"
        try:
            served = kube.served_versions(crd)
        except NotFound:
            failures.append(Check(name, Result.FAILED, f"not installed ({product})", install))
            continue
        except Forbidden as error:
            failures.append(
                Check(
                    name,
                    Result.FAILED,
                    _error(error),
                    f"{RBAC_FIX} (get on customresourcedefinitions, by name)",
                )
            )
            continue
        except KubeError as error:
            failures.append(Check(name, Result.FAILED, _error(error), "see the message"))
            continue
        if version not in served:
            failures.append(
                Check(
                    name,
                    Result.FAILED,
                    f"serves {', '.join(served) or 'no version'}, not {version}",
                    install,
                )
            )
        else:
            served_ok[product, f"{group}/{version}"].append(crd.partition(".")[0])
    rows = [
        Check(f"{product} CRDs", Result.OK, f"{', '.join(plurals)} serve {group_version}")
        for (product, group_version), plurals in served_ok.items()
    ]
    return rows + failures


def check_visibility(kube: KubeClient) -> Check:
    name = "Kueue visibility API"
    base = f"/apis/{VISIBILITY}/{VISIBILITY_VERSION}"
    apiservice = f"{VISIBILITY_VERSION}.{VISIBILITY}"
    not_available = (
        f"kubectl get apiservice {apiservice} says why it is not Available; the Kueue "
        "manager serves it (its visibility server must be reachable from the API server)"
    )
    try:
        discovery = kube.get_path(base)
    except NotFound:
        return Check(
            name,
            Result.FAILED,
            f"{VISIBILITY}/{VISIBILITY_VERSION} is not registered",
            f"{INSTALL[KUEUE]} (its manifests register the APIService {apiservice})",
        )
    except KubeError as error:
        return Check(name, Result.FAILED, _error(error), not_available)
    resources = {str(entry.get("name")) for entry in discovery.get("resources") or []}
    missing = {"clusterqueues/pendingworkloads", "localqueues/pendingworkloads"} - resources
    if missing:
        return Check(
            name,
            Result.FAILED,
            f"{VISIBILITY}/{VISIBILITY_VERSION} lacks {', '.join(sorted(missing))}",
            INSTALL[KUEUE],
        )
    try:
        kube.get_path(f"{base}/clusterqueues/{VISIBILITY_PROBE}/pendingworkloads")
    except NotFound:
        pass  # Kueue's own answer for a ClusterQueue that does not exist.
    except Forbidden as error:
        return Check(name, Result.FAILED, _error(error), RBAC_FIX)
    except KubeError as error:
        return Check(name, Result.FAILED, _error(error), not_available)
    return Check(name, Result.OK, f"{VISIBILITY}/{VISIBILITY_VERSION} answers")


def check_permissions(
    kube: KubeClient,
    identity: str,
    permissions: Sequence[Permission] = REQUIRED,
) -> list[Check]:
    """A ``SelfSubjectAccessReview`` per verb; one failed row per permission lacking any,
    else one ok row for all."""
    questions = list(access_checks(permissions))

    def ask(question: tuple[Permission, str, str | None]) -> AccessReview | KubeError:
        permission, verb, name = question
        try:
            return kube.can_i(
                verb,
                permission.resource,
                group=permission.group,
                subresource=permission.subresource,
                name=name,
            )
        except KubeError as error:
            return error

    with ThreadPoolExecutor(max_workers=REVIEW_WORKERS) as pool:
        answers = list(pool.map(ask, questions))

    missing: dict[Permission, list[str]] = defaultdict(list)
    errors: list[KubeError] = []
    for (permission, verb, name), answer in zip(questions, answers, strict=True):
        if isinstance(answer, KubeError):
            errors.append(answer)
        elif not answer.allowed:
            missing[permission].append(f"{verb} {name}" if name else verb)
    if errors:
        return [
            Check(
                "permissions",
                Result.FAILED,
                f"{len(errors)} access reviews failed: {_error(errors[0])}",
                "see the message (SelfSubjectAccessReview is allowed to every signed-in "
                "identity by default)",
            )
        ]
    if not missing:
        return [
            Check(
                "permissions",
                Result.OK,
                f"all {len(questions)} verbs of the {len(permissions)} rules granted to {identity}",
            )
        ]
    return [
        Check(
            f"permission {permission.label}",
            Result.FAILED,
            f"{identity} may not {', '.join(verbs)} {permission.label} (needed for "
            f"{permission.why})",
            f"{RBAC_FIX} (the ClusterRole {CLUSTER_ROLE} grants it; bind it to {identity}), "
            f"or grant {', '.join(verbs)} on {permission.label} to {identity}",
        )
        for permission, verbs in missing.items()
    ]


def _nodes(kube: KubeClient) -> tuple[list[dict[str, Any]], KubeError | None]:
    try:
        return kube.list("v1", "Node"), None
    except KubeError as error:
        return [], error


def check_flavors(
    flavors: Sequence[Flavor], nodes: Sequence[Mapping[str, Any]], node_error: KubeError | None
) -> list[Check]:
    if not flavors:
        return [
            Check(
                "flavors",
                Result.WARNING,
                "no ResourceFlavor in the portal yet",
                "add one in the admin (/admin/workspaces/resourceflavor/add/) with the node "
                "labels of a pool",
            )
        ]
    if node_error is not None:
        return [
            Check(
                "flavors",
                Result.FAILED,
                f"cannot list nodes: {_error(node_error)}",
                RBAC_FIX if isinstance(node_error, Forbidden) else "see the message",
            )
        ]
    return [_check_flavor(flavor, nodes) for flavor in flavors]


def _check_flavor(flavor: Flavor, nodes: Sequence[Mapping[str, Any]]) -> Check:
    name = f"flavor {flavor.name}"
    selector = ",".join(f"{key}={value}" for key, value in flavor.node_labels.items())
    matching = [node for node in nodes if _has_labels(node, flavor.node_labels)]
    where = f"node labels {selector}" if selector else "no node labels (every node)"
    edit = f"correct the node labels of flavor {flavor.name} in the admin"
    if not matching:
        return Check(
            name,
            Result.FAILED,
            f"no node matches {where}",
            f"{edit}, or label the pool's nodes: kubectl label node <node> "
            f"{selector.replace(',', ' ')}",
        )
    gpus = sum(_gpus(node) for node in matching)
    found = f"{len(matching)} node{'s' if len(matching) != 1 else ''} match {where}"
    if gpus:
        found = f"{found}; {gpus} {GPU_RESOURCE} allocatable"
    if flavor.gpu_model and not gpus:
        return Check(
            name,
            Result.FAILED,
            f"{found}, but none has allocatable {GPU_RESOURCE} (the flavor names GPU "
            f"{flavor.gpu_model})",
            f"run the NVIDIA device plugin (GPU Operator) on these nodes, or {edit}",
        )
    if not any(_tolerated(node, flavor.tolerations) for node in matching):
        untolerated = [
            taint
            for node in matching
            for taint in _blocking_taints(node)
            if not any(_tolerates(toleration, taint) for toleration in flavor.tolerations)
        ]
        example = {"key": untolerated[0].get("key"), "operator": "Exists"}
        example["effect"] = untolerated[0].get("effect")
        return Check(
            name,
            Result.WARNING,
            f"{found}, but every one has a taint the flavor does not tolerate: "
            f"{', '.join(sorted({_taint_text(taint) for taint in untolerated}))}",
            f"add the toleration to flavor {flavor.name} in the admin, e.g. {json.dumps(example)}",
        )
    return Check(name, Result.OK, found)


def check_gpu_nodes(
    flavors: Sequence[Flavor], nodes: Sequence[Mapping[str, Any]], node_error: KubeError | None
) -> Check:
    name = "GPU nodes"
    if node_error is not None:
        return Check(
            name,
            Result.FAILED,
            f"cannot list nodes: {_error(node_error)}",
            RBAC_FIX if isinstance(node_error, Forbidden) else "see the message",
        )
    gpu_nodes = [node for node in nodes if _gpus(node) > 0]
    if not gpu_nodes:
        promised = sorted(flavor.name for flavor in flavors if flavor.gpu_model)
        fix = (
            f"add GPU nodes with the NVIDIA device plugin (GPU Operator), so that they report "
            f"allocatable {GPU_RESOURCE}"
        )
        if promised:
            return Check(
                name,
                Result.FAILED,
                f"no node has allocatable {GPU_RESOURCE}, but flavor(s) "
                f"{', '.join(promised)} name a GPU model",
                fix,
            )
        return Check(
            name,
            Result.WARNING,
            f"no node has allocatable {GPU_RESOURCE} (CPU-only runs still work)",
            fix,
        )
    usable = [node for node in gpu_nodes if _ready(node) and not _cordoned(node)]
    total = sum(_gpus(node) for node in gpu_nodes)
    detail = (
        f"{len(gpu_nodes)} node{'s' if len(gpu_nodes) != 1 else ''} with {total} "
        f"{GPU_RESOURCE} allocatable; {len(usable)} Ready and not cordoned"
    )
    if not usable:
        return Check(
            name,
            Result.WARNING,
            detail,
            "kubectl describe node <node>: see why none is Ready, or uncordon one",
        )
    return Check(name, Result.OK, detail)


# -- nodes ------------------------------------------------------------------------------------


def _has_labels(node: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    node_labels = (node.get("metadata") or {}).get("labels") or {}
    return all(node_labels.get(key) == value for key, value in labels.items())


def _gpus(node: Mapping[str, Any]) -> int:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    try:
        return int(parse_quantity(allocatable.get(GPU_RESOURCE, 0)).to_integral_value())
    except (QuantityError, ArithmeticError):
        return 0


def _ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _cordoned(node: Mapping[str, Any]) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def _blocking_taints(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Taints that keep pods off unless tolerated; Kubernetes' own ``node.kubernetes.io/*``
    taints (not ready, unreachable, cordoned) come and go and are not a flavor's business."""
    return [
        taint
        for taint in (node.get("spec") or {}).get("taints") or []
        if taint.get("effect") in ("NoSchedule", "NoExecute")
        and not str(taint.get("key", "")).startswith("node.kubernetes.io/")
    ]


def _tolerated(node: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    return all(
        any(_tolerates(toleration, taint) for toleration in tolerations)
        for taint in _blocking_taints(node)
    )


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' rule (``v1.Toleration.ToleratesTaint``)."""
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key")
    operator = toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    return bool(toleration.get("value", "") == taint.get("value", ""))


def _taint_text(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    key = f"{taint.get('key')}={value}" if value else str(taint.get("key"))
    return f"{key}:{taint.get('effect')}"


def _error(error: KubeError) -> str:
    return f"{type(error).__name__}: {error.message}"


# -- the table --------------------------------------------------------------------------------

COLUMNS: Final[tuple[tuple[str, int], ...]] = (("CHECK", 34), ("RESULT", 60), ("WHAT TO DO", 60))


def _cells(check: Check) -> tuple[str, str, str]:
    return check.check, f"{check.result.value}: {check.detail}", check.fix or "-"


def render_table(report: Report) -> str:
    """The report's rows in three columns, long cells wrapped, and a summary line."""
    rows = [_cells(check) for check in report.checks]
    widths = [
        min(limit, max([len(title), *(len(row[index]) for row in rows)]))
        for index, (title, limit) in enumerate(COLUMNS)
    ]
    lines = [
        "  ".join(
            title.ljust(width) for (title, _), width in zip(COLUMNS, widths, strict=True)
        ).rstrip()
    ]
    for row in rows:
        wrapped = [_wrap(cell, width) for cell, width in zip(row, widths, strict=True)]
        for index in range(max(len(cell) for cell in wrapped)):
            parts = [
                (cell[index] if index < len(cell) else "").ljust(width)
                for cell, width in zip(wrapped, widths, strict=True)
            ]
            lines.append("  ".join(parts).rstrip())
    counts = report.counts()
    summary = ", ".join(
        f"{counts[result.value]} {result.value}" for result in Result if result.value in counts
    )
    verdict = "ready for TauGrid" if report.ok else "NOT ready for TauGrid"
    lines.append("")
    lines.append(f"{report.server} as {report.identity}: {summary}; {verdict}")
    return "\n".join(lines)


def _wrap(text: str, width: int) -> list[str]:
    # Not on hyphens: names like gpu-h100 and kueue.x-k8s.io stay whole.
    return textwrap.wrap(text, width, break_on_hyphens=False, break_long_words=False) or [""]


def flavors_from_rows(rows: Iterable[Any]) -> list[Flavor]:
    """:class:`Flavor` values of ResourceFlavor rows."""
    return [
        Flavor(
            name=row.name,
            node_labels=dict(row.node_labels or {}),
            tolerations=list(row.tolerations or []),
            gpu_model=row.gpu_model or "",
        )
        for row in rows
    ]
