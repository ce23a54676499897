"""Issue 33's first acceptance point on the Kubernetes backend: raw data → the data-preparation
run → its tokenized version → the training run → a model version, with the real example
programs, the suite's S3 server (SeaweedFS) and the test cluster.

The portal's processes are real (web, worker, beat, the watcher) and so is the cluster's part up
to the pod: Kueue admits each run, kube-scheduler binds its pod to a fake KWOK node. A fake node
runs no container, so the test plays the kubelet for each pod, exactly as the Job object the API
server keeps says: every init container, then the main container, each its command and
arguments, its environment (the run token from the attempt's Secret), its working directory and
its volumes (the workspace's storage claim is the folder the portal mounts at
TAU_DATA_PREFIX_DIR/<workspace>/; an emptyDir is a fresh folder). So the bundle fetcher
downloads the bundle the portal was sent, the stager stages the pinned version from S3 through
the portal's presigned URLs, and the example's own program (prepare.py, then train.py: standard
library only, as their python:3.12-slim image is) reads TAU_DATA_DIR and writes TAU_OUTPUT_DIR
on the claim, reporting its metrics with the workload SDK the fetcher unpacked. What it printed
is the pod's log (a KWOK ``Logs`` object), and the pod ends when the program has: the test
tells KWOK so (``taugrid.io/test-duration: 0s`` on the pod, deploy/cluster/kwok/stages.yaml).
Then the watcher, as for any run, records the success and makes the output folder a version.

The same chain on the local backend: tests/executors/local/test_agent_datasets.py."""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kube as adapter
from catalog.ingest import asset_named, ingest_folder
from kube.errors import KubeError
from kube.pod_logs import read_pod_log
from tests.cluster.plugin import Kube, wait_until
from tests.executors.kubernetes.test_kube_end_to_end import (  # noqa: F401 (fixtures)
    KWOK_API,
    Team,
    bind_claim,
    cleanup,
    get_json_list,
    portal,
    uid,
)
from tests.runs.factories import zip_directory
from tests.runs.processes import BIN, ROOT, Portal, get_json, multipart_form

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

EXAMPLES = ROOT / "examples"
#: The examples' image has Python and its standard library only: their programs run here the
#: same way, without this environment's site-packages (``-S``; PYTHONPATH, which the Job sets
#: to the workload SDK, still counts).
PYTHON = [str(BIN / "python"), "-S"]
#: Longer than the test: the pod ends when the test says its program has (KWOK's annotation).
LASTS = "10m"
TEST_DURATION = "taugrid.io/test-duration"


def submit_example_folder(team: Team, example: str) -> str:
    """``tau run`` of an example: its tau.yaml and its folder as the bundle, over HTTP; the pod
    lasts until the test ends it (``runtime.env``, read by the fake nodes only)."""
    folder = EXAMPLES / example
    spec = (folder / "tau.yaml").read_text()
    assert "\nruntime:\n" in spec
    spec = spec.replace(
        "\nruntime:\n", f'\nruntime:\n  env: {{TAUGRID_TEST_DURATION: "{LASTS}"}}\n'
    )
    body, content_type = multipart_form(
        [("spec", "tau.yaml", spec.encode()), ("bundle", "project.zip", zip_directory(folder))]
    )
    request = urllib.request.Request(
        team.base,
        data=body,
        headers={"Authorization": f"Bearer {team.token}", "Content-Type": content_type},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 201
        return str(json.loads(response.read())["name"])


class FakeKubelet:
    """Runs a Job's pod here as the kubelet would have on a real node, from the Job object."""

    def __init__(self, kube: Kube, namespace: str, claim_folder: Path, scratch: Path) -> None:
        self.kube = kube
        self.namespace = namespace
        self.claim_folder = claim_folder
        self.scratch = scratch

    def run_pod(self, job_name: str) -> str:
        """Every container of the Job's pod in order, each to its end (a failure fails the
        test with what it printed); what the main container printed."""
        job = self.kube.get("batch/v1", "Job", job_name, self.namespace)
        assert job is not None, job_name
        pod = job["spec"]["template"]["spec"]
        volumes: dict[str, Path] = {}
        for volume in pod["volumes"]:
            if "persistentVolumeClaim" in volume:
                volumes[volume["name"]] = self.claim_folder
            else:
                assert "emptyDir" in volume, volume
                volumes[volume["name"]] = self.scratch / job_name / volume["name"]
                volumes[volume["name"]].mkdir(parents=True)
        containers: list[dict[str, Any]] = [*pod.get("initContainers", []), *pod["containers"]]
        *init_containers, main = containers
        assert [c["name"] for c in pod["containers"]] == [main["name"]]
        for container in init_containers:
            self.run_container(container, volumes)
        return self.run_container(main, volumes)

    def placed(
        self, container: dict[str, Any], volumes: dict[str, Path]
    ) -> tuple[Callable[[str], str], dict[str, str]]:
        """The container's paths as folders here (its volume mounts; a function of a path
        inside it) and its environment (secrets read, paths placed)."""
        mounts: dict[str, Path] = {}
        for mount in container.get("volumeMounts", []):
            folder = volumes[mount["name"]] / mount.get("subPath", "")
            folder.mkdir(parents=True, exist_ok=True)  # the kubelet makes a missing subPath
            mounts[mount["mountPath"]] = folder

        def here(word: str) -> str:
            """A path inside the container as the folder it is here (the longest mount)."""
            for mount_path in sorted(mounts, key=len, reverse=True):
                if word == mount_path or word.startswith(mount_path + "/"):
                    return str(mounts[mount_path]) + word[len(mount_path) :]
            return ":".join(here(part) for part in word.split(":")) if ":" in word else word

        env: dict[str, str] = {}
        for variable in container.get("env", []):
            if "valueFrom" in variable:
                ref = variable["valueFrom"]["secretKeyRef"]
                secret = self.kube.get("v1", "Secret", ref["name"], self.namespace)
                assert secret is not None, ref
                env[variable["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
            else:
                env[variable["name"]] = here(variable.get("value", ""))
        return here, env

    def run_container(self, container: dict[str, Any], volumes: dict[str, Path]) -> str:
        here, placed_env = self.placed(container, volumes)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.scratch), **placed_env}
        command: list[str] = [*container["command"], *container.get("args", [])]
        program, *words = command
        assert program in {"python", "python3"}, container["command"]
        done = subprocess.run(
            [*PYTHON, *(here(word) for word in words)],
            cwd=here(container.get("workingDir", "/")),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{container['name']}: {done.stdout}{done.stderr}"
        return done.stdout + done.stderr

    def end_pod(self, job_name: str, printed: str) -> None:
        """The pod's main container has ended, having printed ``printed``: that is its log on
        the fake node (a KWOK ``Logs`` object; readable through ``pods/log`` before the pod
        ends, so the watcher keeps it), and the pod succeeds now (KWOK's annotation)."""
        (pod,) = self.kube.list("v1", "Pod", self.namespace, label_selector=f"job-name={job_name}")
        name = pod["metadata"]["name"]
        log_file = self.scratch / f"{name}.log"
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        log_file.write_text("".join(f"{stamp} stdout F {line}\n" for line in printed.splitlines()))
        self.kube.create(
            {
                "apiVersion": KWOK_API,
                "kind": "Logs",
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": {"logs": [{"logsFile": str(log_file)}]},
            }
        )
        client = adapter.KubeClient(adapter.new_api_client(self.kube.cluster.kubeconfig))
        try:

            def readable() -> bool | None:
                try:
                    text = read_pod_log(client, self.namespace, name, container="workload")
                except KubeError:  # until KWOK's watch has the Logs object
                    return None
                return True if text.decode() == printed.rstrip("\n") + "\n" else None

            wait_until(f"{name}'s log on its node", readable, timeout=30, interval=0.2)
        finally:
            client.close()
        self.kube.patch(
            "v1", "Pod", name, self.namespace, {"metadata": {"annotations": {TEST_DURATION: "0s"}}}
        )


def evidence_of(team: Team, run: str) -> bytes:
    """The run's sealed evidence, as ``GET …/evidence/`` exports it once the worker sealed it."""

    def sealed() -> bytes | None:
        request = urllib.request.Request(
            f"{team.base}{run}/evidence/", headers={"Authorization": f"Bearer {team.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as error:
            if error.code == 409:
                return None
            raise

    return bytes(
        wait_until(
            f"{run}'s evidence sealed",
            sealed,
            timeout=60,
            interval=0.2,
            describe=lambda: team.portal.log("worker")[-3000:],
        )
    )


def test_data_prep_then_training_on_the_cluster_make_one_lineage_from_raw_data_to_a_model(
    s3_store: Any,  # first: it makes the var folder the portal's processes share
    portal: Portal,  # noqa: F811 (the fixture imported above)
    cleanup: None,  # noqa: F811
    kube: Kube,
    uid: str,  # noqa: F811
    tmp_path: Path,
    django_user_model: Any,
) -> None:
    started = time.monotonic()
    service = s3_store.service
    prefixes = tmp_path / "prefixes"
    portal.env.update(
        {
            "TAU_DATA_PREFIX_DIR": str(prefixes),
            "TAU_API_URL": portal.url,
            "TAU_STORAGE_URL": s3_store.url,
            "TAU_STORAGE_ENDPOINT_URL": service.endpoint,
            "TAU_STORAGE_REGION": "us-east-1",
            "TAU_STORAGE_ACCESS_KEY_ID": service.access_key,
            "TAU_STORAGE_SECRET_ACCESS_KEY": service.secret_key,
        }
    )
    portal.start()
    portal._spawn("watcher", [str(BIN / "python"), str(ROOT / "manage.py"), "run_kube_watcher"])
    claim = f"data-{uid}"
    place = Team(portal, uid, django_user_model, cpus=2, storage_claim=claim)
    namespace = place.workspace.namespace
    bind_claim(kube, uid, namespace, claim)
    claim_folder = prefixes / place.workspace.slug
    claim_folder.mkdir(parents=True)
    kubelet = FakeKubelet(kube, namespace, claim_folder, tmp_path / "pods")

    raw_folder = tmp_path / "reviews-raw"
    subprocess.run(
        [sys.executable, str(EXAMPLES / "data-prep" / "make_raw.py"), str(raw_folder)], check=True
    )
    raw = ingest_folder(
        asset_named(place.workspace, "dataset", "reviews-raw"), raw_folder, source="upload"
    )
    assert s3_store.object_keys()  # the raw version's files are in the S3 server

    runs: dict[str, str] = {}
    printed: dict[str, str] = {}
    for example in ("data-prep", "train-on-data"):
        name = runs[example] = submit_example_folder(place, example)
        place.wait(name, "running", timeout=90)
        job_name = place.attempt(name, 1).backend_name.partition("/")[2]
        printed[example] = kubelet.run_pod(job_name)
        kubelet.end_pod(job_name, printed[example])
        done = place.wait(name, "succeeded", "failed", timeout=60)
        assert done["state"] == "succeeded", (done, portal.log("watcher")[-3000:])
    assert "kept 600, dropped 40 duplicates and 3 too short" in printed["data-prep"]
    assert "training on 480 examples of" in printed["train-on-data"]

    # The lineage through the API: raw → data-prep → tokenized → train-on-data → model.
    api = f"{portal.url}/api/v1/workspaces/{place.workspace.slug}"
    tokenized = get_json(f"{api}/datasets/reviews-tokenized/versions/1/", place.token)
    model = get_json(f"{api}/models/reviews-classifier/versions/1/", place.token)
    assert (tokenized["state"], tokenized["derived_from"], tokenized["produced_by"]) == (
        "ready",
        ["reviews-raw@1"],
        runs["data-prep"],
    )
    assert (model["state"], model["derived_from"], model["produced_by"]) == (
        "ready",
        ["reviews-tokenized@1"],
        runs["train-on-data"],
    )
    assert tokenized["files_count"] == 3  # vocab.txt, examples.jsonl, stats.json
    files = get_json(f"{api}/models/reviews-classifier/versions/1/files/", place.token)
    assert {row["path"] for row in files["results"]} == {"model.json", "vocab.txt"}
    # The metrics train.py reported through the SDK, snapshotted on the model version.
    assert model["metrics"]["val_accuracy"] > 0.9, model["metrics"]

    # Each run staged what it read before its program ran (the stager's report: the raw
    # version's bytes, then the bytes the first run wrote), and its log is what its program
    # printed, kept by the watcher.
    for example, files_and_bytes in (
        ("data-prep", (raw.files_count, raw.bytes)),
        ("train-on-data", (tokenized["files_count"], tokenized["bytes"])),
    ):
        events = get_json_list(f"{place.base}{runs[example]}/events/", place.token)
        (said,) = [event for event in events if event["kind"] == "data-staged"]
        assert (said["data"]["files"], said["data"]["bytes"]) == files_and_bytes, said
        log = get_json(f"{place.base}{runs[example]}/logs/", place.token)["text"]
        assert log == printed[example].rstrip("\n") + "\n"

    # Each run's sealed evidence verifies offline and names the digests both ways.
    keyring = tmp_path / "keys.json"
    with urllib.request.urlopen(f"{portal.url}/api/v1/evidence/keys/", timeout=30) as response:
        keyring.write_bytes(response.read())
    for example, read, made in (
        (
            "data-prep",
            ("reviews-raw@1", raw.manifest_digest),
            ("dataset", "reviews-tokenized@1", tokenized["manifest_digest"]),
        ),
        (
            "train-on-data",
            ("reviews-tokenized@1", tokenized["manifest_digest"]),
            ("model", "reviews-classifier@1", model["manifest_digest"]),
        ),
    ):
        export = tmp_path / f"{example}.evidence.tar"
        export.write_bytes(evidence_of(place, runs[example]))
        checked = subprocess.run(
            [sys.executable, "-m", "tau.evidence", "verify", str(export), "--key", str(keyring)],
            cwd=ROOT,
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=False,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        with tarfile.open(fileobj=io.BytesIO(export.read_bytes())) as tar:
            extracted = tar.extractfile("manifest.json")
            assert extracted is not None
            data = json.loads(extracted.read())["data"]
        assert [(item["ref"], item["manifest_digest"]) for item in data["read"]] == [read]
        assert [
            (item["kind"], item["ref"], item["manifest_digest"]) for item in data["produced"]
        ] == [made]
    print(f"the chain took {time.monotonic() - started:.1f} s")
