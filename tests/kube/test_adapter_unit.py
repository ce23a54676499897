"""The Kubernetes adapter without a cluster: error mapping from Status bodies as the API server
and Kueue's webhooks write them, configuration failures, the shared client, and the failures
a dead or silent endpoint causes (refused connection, read timeout), each fast.

The behaviour against the real API server, Kueue and RBAC is in test_adapter_cluster.py.
"""

from __future__ import annotations

import ast
import contextlib
import json
import socket
import sys
import threading
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

import kube
from kube.api import KubeClient, without_suspend
from kube.errors import error_from_response

REPO = Path(__file__).resolve().parents[2]


def status(code: int, message: str, reason: str = "", **details: Any) -> str:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return json.dumps(body)


# ---------------------------------------------------------------------------------------------
# Error mapping: one table, status + body → type, status, reason, message
# ---------------------------------------------------------------------------------------------

QUEUE_DENIAL = (
    'admission webhook "vclusterqueue.kb.io" denied the request: '
    'spec.resourceGroups[0].flavors[0].resources[0].lendingLimit: Invalid value: "9": '
    "must be less than or equal to the nominalQuota"
)

MAPPING = [
    (404, status(404, 'configmaps "x" not found', "NotFound"), kube.NotFound, "NotFound"),
    (409, status(409, 'jobs.batch "x" already exists', "AlreadyExists"), kube.Conflict, ""),
    (409, status(409, "Apply failed with 1 conflict", "Conflict"), kube.Conflict, "Conflict"),
    (403, status(403, 'cannot get resource "configmaps"', "Forbidden"), kube.Forbidden, ""),
    (401, status(401, "Unauthorized", "Unauthorized"), kube.Unauthorized, "Unauthorized"),
    (422, status(422, 'ClusterQueue "q" is invalid', "Invalid"), kube.Invalid, "Invalid"),
    (400, status(400, "unable to parse requirement", "BadRequest"), kube.Invalid, "BadRequest"),
    # Kueue answers through controller-runtime's Denied: 403, and yet not an RBAC problem.
    (403, status(403, QUEUE_DENIAL, "Forbidden"), kube.RefusedByWebhook, "Forbidden"),
    (422, status(422, QUEUE_DENIAL, "Invalid"), kube.RefusedByWebhook, "Invalid"),
    (429, status(429, "too many requests", "TooManyRequests"), kube.Unavailable, ""),
    (
        500,
        status(
            500,
            'Internal error occurred: failed calling webhook "mjob.kb.io": connection refused',
            "InternalError",
        ),
        kube.Unavailable,
        "InternalError",
    ),
    (503, "<html><body>Service Unavailable</body></html>", kube.Unavailable, "Service Unav"),
    # What the real API server answers to an apply with a flavor listed twice: not transient.
    (
        500,
        status(
            500,
            "failed to create typed patch object (/q; kueue.x-k8s.io/v1beta2, Kind=ClusterQueue)"
            ': .spec.resourceGroups[0].flavors: duplicate entries for key [name="f"]',
        ),
        kube.Invalid,
        "Service Unav",
    ),
    (410, status(410, "too old resource version", "Expired"), kube.Gone, "Expired"),
]


@pytest.mark.parametrize(("code", "body", "kind", "reason"), MAPPING)
def test_error_mapping(code: int, body: str, kind: type[kube.KubeError], reason: str) -> None:
    error = error_from_response(code, body.encode(), http_reason="Service Unav")
    assert type(error) is kind
    assert error.status == code
    if reason:
        assert error.reason == reason
    parsed = json.loads(body) if body.startswith("{") else None
    expected = parsed["message"] if parsed else "<html><body>Service Unavailable</body></html>"
    assert error.message == expected
    assert str(error) == expected
    assert isinstance(error, kube.KubeError)


def test_webhook_denial_carries_the_webhooks_own_message_and_causes() -> None:
    body = status(
        403,
        QUEUE_DENIAL,
        "Forbidden",
        causes=[
            {
                "reason": "FieldValueInvalid",
                "message": "must be less than or equal to the nominalQuota",
                "field": "spec.resourceGroups[0].flavors[0].resources[0].lendingLimit",
            }
        ],
    )
    error = error_from_response(403, body)
    assert isinstance(error, kube.RefusedByWebhook)
    assert isinstance(error, kube.Invalid)
    assert not isinstance(error, kube.Forbidden)
    assert error.webhook == "vclusterqueue.kb.io"
    assert error.webhook_message.startswith("spec.resourceGroups[0].flavors[0]")
    assert error.webhook_message.endswith("must be less than or equal to the nominalQuota")
    assert error.causes == (
        kube.Cause(
            field="spec.resourceGroups[0].flavors[0].resources[0].lendingLimit",
            message="must be less than or equal to the nominalQuota",
            reason="FieldValueInvalid",
        ),
    )


def test_webhook_denial_without_explanation() -> None:
    error = error_from_response(
        400, status(400, 'admission webhook "x.example.org" denied the request without explanation')
    )
    assert isinstance(error, kube.RefusedByWebhook)
    assert error.webhook == "x.example.org"
    assert error.webhook_message == "without explanation"


def test_an_empty_or_odd_body_still_gives_a_readable_message() -> None:
    error = error_from_response(502, b"", http_reason="Bad Gateway")
    assert isinstance(error, kube.Unavailable)
    assert error.message == "the Kubernetes API answered 502 Bad Gateway"
    long = error_from_response(500, b"x" * 5000)
    assert len(long.message) <= 300


def test_apiexception_without_status_is_unavailable() -> None:
    """The generated client turns a TLS failure into ApiException(status=0): no answer."""

    class BrokenApi:
        class configuration:  # stands in for the ApiClient's attribute
            host = "https://user:hunter2@127.0.0.1:6443"

        def param_serialize(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
            return ("GET", "https://127.0.0.1:6443/api/v1", {}, None, [])

        def call_api(self, *args: Any, **kwargs: Any) -> Any:
            raise ApiException(status=0, reason="SSLError\ncertificate verify failed")

    client = KubeClient(BrokenApi())  # type: ignore[arg-type]
    with pytest.raises(kube.Unavailable) as raised:
        client.get_path("/version")
    assert raised.value.status == 0
    assert "certificate verify failed" in raised.value.message
    assert "127.0.0.1:6443" in raised.value.message
    assert "hunter2" not in raised.value.message
    assert "hunter2" not in repr(client)


def test_apply_bodies_lose_spec_suspend_and_the_callers_dict_is_kept() -> None:
    body = {"apiVersion": "batch/v1", "kind": "Job", "spec": {"suspend": True, "parallelism": 2}}
    assert without_suspend(body) == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "spec": {"parallelism": 2},
    }
    assert body["spec"] == {"suspend": True, "parallelism": 2}
    assert without_suspend({"kind": "ConfigMap", "data": {"a": "b"}}) == {
        "kind": "ConfigMap",
        "data": {"a": "b"},
    }


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


def kubeconfig_for(path: Path, server: str, token: str = "not-a-real-token") -> Path:
    """A kubeconfig with a bearer token (no cluster behind it unless `server` has one)."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}
                ],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture
def fresh_shared_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    kube.reset_client()
    yield
    kube.reset_client()


def test_missing_kubeconfig_file_says_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_shared_client: None
) -> None:
    missing = tmp_path / "nope" / "kubeconfig"
    monkeypatch.setenv("TAU_KUBECONFIG", str(missing))
    with pytest.raises(kube.KubeConfigError) as raised:
        kube.client()
    message = raised.value.message
    assert str(missing) in message
    assert "TAU_KUBECONFIG" in message
    assert "kubeconfig" in message
    assert isinstance(raised.value, kube.KubeError)


def test_no_kubeconfig_outside_a_pod_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch, fresh_shared_client: None
) -> None:
    monkeypatch.delenv("TAU_KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(kube.KubeConfigError) as raised:
        kube.api_client()
    assert "set TAU_KUBECONFIG" in raised.value.message
    assert "ServiceAccount" in raised.value.message


def test_a_broken_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\ncontexts: []\n")
    with pytest.raises(kube.KubeConfigError) as raised:
        kube.new_api_client(broken)
    assert str(broken) in raised.value.message


def test_one_shared_client_per_process_until_reset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_shared_client: None
) -> None:
    monkeypatch.setenv(
        "TAU_KUBECONFIG", str(kubeconfig_for(tmp_path / "kc", "https://127.0.0.1:9"))
    )
    seen: list[KubeClient] = []
    barrier = threading.Barrier(8)

    def grab() -> None:
        barrier.wait()
        seen.append(kube.client())

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 8
    assert all(found is seen[0] for found in seen)
    assert seen[0].api is kube.api_client()
    kube.reset_client()
    assert kube.client() is not seen[0]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_closed_port_is_unavailable_fast(tmp_path: Path) -> None:
    token = "sekrit-token-1234567890"
    api = kube.new_api_client(
        kubeconfig_for(tmp_path / "kc", f"https://127.0.0.1:{free_port()}", token)
    )
    client = KubeClient(api, timeout=(0.5, 0.5))
    started = time.monotonic()
    with pytest.raises(kube.Unavailable) as raised:
        client.get("v1", "ConfigMap", "x", "default")
    assert time.monotonic() - started < 6  # refused at once, not retried for long
    error = raised.value
    assert error.status == 0
    assert "cannot reach the Kubernetes API at https://127.0.0.1:" in error.message
    assert "refused" in error.message.lower()
    assert token not in error.message
    assert token not in repr(error)
    assert token not in repr(client)


def test_a_silent_server_times_out(tmp_path: Path) -> None:
    """A listener that accepts and never answers: the read timeout ends the call."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        api = kube.new_api_client(kubeconfig_for(tmp_path / "kc", f"https://127.0.0.1:{port}"))
        client = KubeClient(api, timeout=(1.0, 0.3))
        started = time.monotonic()
        with pytest.raises(kube.Unavailable) as raised:
            client.get_path("/version")
        elapsed = time.monotonic() - started
        # One retry of an idempotent read: two connections, each given up after the read
        # timeout, never urllib3's default four. Counted at the listener, not timed: how long
        # two timeouts take depends on the machine's load (2.7 s once, beside the suite).
        silent.settimeout(0.5)
        connections = 0
        with contextlib.suppress(TimeoutError):
            while True:
                accepted, _ = silent.accept()
                accepted.close()
                connections += 1
    assert connections == 2
    assert elapsed < 30  # it ended (a hang would be the test's own timeout)
    assert "within 0.3 s" in raised.value.message


# ---------------------------------------------------------------------------------------------
# The boundary: kube/ is the only importer of `kubernetes`, and imports none of the apps
# ---------------------------------------------------------------------------------------------

SKIP_DIRS = {".venv", "var", "node_modules", "tests", "deploy", "examples", "benchmarks", ".git"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def project_files() -> Iterator[Path]:
    # The skipped folders are left before they are walked: .venv alone holds thousands of
    # files (walking the whole checkout took 2-3 s).
    for top in sorted(REPO.iterdir()):
        if top.name in SKIP_DIRS or top.name.startswith("."):
            continue
        for path in [top] if top.is_file() else top.rglob("*.py"):
            relative = path.relative_to(REPO)
            if path.suffix == ".py" and not any(part.startswith(".") for part in relative.parts):
                yield path


def test_only_kube_imports_the_kubernetes_client() -> None:
    importers = sorted(
        str(path.relative_to(REPO))
        for path in project_files()
        # Only a file that names the client can import it: the others are not parsed (Python
        # reads names as NFKC, so a name written in other forms of the letters is found too).
        if "kubernetes" in unicodedata.normalize("NFKC", path.read_text())
        and "kubernetes" in imported_modules(path)
    )
    assert importers, "kube/ itself should be found"
    assert all(name.startswith("kube/") for name in importers), importers


def test_kube_imports_only_the_standard_library_and_its_client() -> None:
    allowed = set(sys.stdlib_module_names) | {"kubernetes", "urllib3", "kube", "__future__"}
    for path in sorted((REPO / "kube").rglob("*.py")):
        extra = imported_modules(path) - allowed
        assert not extra, f"{path.relative_to(REPO)} imports {sorted(extra)}"
