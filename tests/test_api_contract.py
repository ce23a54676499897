"""The published API contract, checked from outside as a client would: schemathesis (from
PyPI, in its own cached venv, ``deploy/dev/schemathesis_venv.py``) against a live portal
(gunicorn on the suite's PostgreSQL), with its default checks: no server error, no answer
that violates the schema (status code, content type, headers, body), no schema-valid request
refused, no schema-violating request accepted, no request accepted without credentials, no
object of one workspace handed to a token of another.

The tokens are the fixed cast's, one per role (``tests/conftest.py``): a researcher, a viewer
and an admin of ``alpha``, the admin of ``beta`` (the ``outsider``), platform staff, and the
run token of a run in ``alpha``. schemathesis tries them in that order per operation and keeps
the first that an operation does not refuse (so each operation is exercised by the lowest
role that may call it), and replays every successful read of one workspace's object with the
other workspace's token (``peers``). Path parameters come from the objects that exist (both
workspaces' slugs, runs, members, datasets, models and endpoints, most of the time) so that
operations reach their data.

Bounded in time: ``MAX_EXAMPLES`` per operation and phase, one worker; about two minutes
on two cores, most of it schemathesis' own generating of the fuzzing phase's cases (the
portal answers in a few milliseconds once it keeps its database connection).
``test_a_token_never_reads_another_workspaces_objects`` walks every read operation with the
other workspace's token and ids itself, as a floor under the fuzzer.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from catalog.ingest import asset_named, ingest_folder, set_alias
from evidence import sealing
from evidence.models import EvidenceRecord, SealRequest
from identity import tokens
from pipelines import orchestration
from pipelines.models import Pipeline
from runs import artifacts, run_tokens, submission
from runs.models import Checkpoint, MetricPoint, Run, RunAttempt, RunState
from runs.state import transition
from tests.evidence.helpers import TEST_SIGNING_KEY
from tests.pipelines.factories import make_pipeline
from tests.runs.factories import TINY_FILES, TINY_SPEC, zip_bytes
from tests.runs.processes import Portal, portal_processes
from tests.scripts import load_script
from tests.serving.factories import ENDPOINT_SPEC, make_endpoint
from workspaces.models import Membership, Role


def ensure_schemathesis() -> Path:
    """deploy/dev/schemathesis_venv.py's installer, loaded by path (deploy/ is no package)."""
    script = Path(__file__).resolve().parents[1] / "deploy" / "dev" / "schemathesis_venv.py"
    return Path(load_script(script, "taugrid_schemathesis_venv").ensure_schemathesis())


pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

#: Test cases per operation in each generating phase (schemathesis' default is 100).
MAX_EXAMPLES = 25
#: The whole schemathesis run may take this long before the test fails.
RUN_TIMEOUT_SECONDS = 420
#: Who calls, in the order schemathesis tries them per operation (the lowest role first).
IDENTITIES = ("viewer", "researcher", "workspace_admin", "outsider", "platform_admin", "run")


@dataclass
class Contract:
    """The live portal, the plaintext tokens by identity, and what exists in each workspace."""

    portal: Portal
    tokens: dict[str, str]
    alpha_runs: list[Run]
    beta_runs: list[Run]
    schema: dict[str, Any]


#: The artifact each furnished finished run keeps (its spec declares it).
ARTIFACT = "model.json"


#: The one file of each workspace's dataset (``<slug>-wiki``), which the second run reads,
#: and of its model of that name, which its endpoint (``<slug>-wiki`` too) serves.
DATA_FILE = b"some text\n"


def _submit(world: Any, workspace: Any, who: str, name: str, *, reads: bool = False) -> Run:
    spec = TINY_SPEC.replace(b"name: tiny", f"name: {name}".encode())
    spec += f"outputs:\n  artifacts: [{ARTIFACT}]\n".encode()
    if reads:
        spec += f"inputs:\n  datasets:\n    - {{name: {workspace.slug}-wiki}}\n".encode()
    return submission.submit(
        workspace=workspace,
        user=world.users[who],
        spec_source=spec,
        bundle=io.BytesIO(zip_bytes(TINY_FILES)),
    )


def _furnish(world: Any) -> tuple[list[Run], list[Run]]:
    """Runs in both workspaces, one finished with metrics, events and checkpoints; a dataset,
    a model and an endpoint in each; members that may be changed and removed without taking a
    token's access away."""
    users = type(world.users["researcher"])._default_manager
    for username, role in (("mia", Role.RESEARCHER), ("max", Role.VIEWER)):
        Membership.objects.create(
            workspace=world.alpha, user=users.create_user(username=username), role=role
        )
    Membership.objects.create(
        workspace=world.beta, user=users.create_user(username="bea"), role=Role.VIEWER
    )
    # A dataset and a model in each workspace (``<slug>-wiki``, version 1 aliased ``train``).
    files = Path(tempfile.mkdtemp(prefix="tau-contract-"))
    (files / "part-0.txt").write_bytes(DATA_FILE)
    for workspace in (world.alpha, world.beta):
        for kind in ("dataset", "model"):
            asset = asset_named(workspace, kind, f"{workspace.slug}-wiki")
            version = ingest_folder(asset, files, source="prefix")
            set_alias(version, "train")
            # What ``best`` compares (a run's final metrics, kept with the version).
            version.metrics = {"val_loss": 0.5}
            version.save(update_fields=["metrics"])
    # An endpoint in each (``<slug>-wiki``: the names the object routes are filled with),
    # with a project zip, serving its workspace's model ``<slug>-wiki@train``: its bundle,
    # its model's listing and file are there to read. Deployed on the serving tests' backend
    # (nothing runs it: it stays ``deploying``); the portal reads it with its own.
    for workspace, who in ((world.alpha, "researcher"), (world.beta, "outsider")):
        name = f"{workspace.slug}-wiki"
        serves = f"  replicas: 1\n  model: {{name: {name}, version: train}}\n"
        spec = ENDPOINT_SPEC.replace(b"  replicas: 1\n", serves.encode())
        make_endpoint(world, who=who, workspace=workspace, spec=spec, name=name)
    # A pipeline in each, renamed ``<slug>-wiki`` (a pipeline's name is made when it is
    # submitted), cancelled once its first stage started, and that stage's run record sealed:
    # its record has something to answer.
    for workspace, who in ((world.alpha, "researcher"), (world.beta, "outsider")):
        pipeline = make_pipeline(world, workspace=workspace, who=who)
        Pipeline.objects.unscoped().filter(pk=pipeline.pk).update(name=f"{workspace.slug}-wiki")
        pipeline.refresh_from_db()
        orchestration.cancel_pipeline(pipeline=pipeline, user=None)
        with override_settings(TAU_EVIDENCE_SIGNING_KEY=TEST_SIGNING_KEY):
            for request in SealRequest.objects.unscoped().filter(
                run__pipeline_stage__pipeline=pipeline
            ):
                assert sealing.seal(request.pk)
    # The second run of each reads its workspace's dataset (its staging listing and file).
    alpha = [
        _submit(world, world.alpha, "researcher", name, reads=name == "sweep")
        for name in ("train", "sweep")
    ]
    beta = [
        _submit(world, world.beta, "outsider", name, reads=name == "private")
        for name in ("secret", "private")
    ]
    for run in (alpha[1], beta[1]):
        MetricPoint.objects.bulk_create(
            MetricPoint(run=run, attempt=1, key="loss", step=step, value=1 / (step + 1))
            for step in range(10)
        )
        Checkpoint.objects.create(run=run, attempt=1, step=5, path=f"/ckpt/{run.name}/step-5")
        artifacts.store_artifact(
            run=run, attempt=1, name=ARTIFACT, source=io.BytesIO(b'{"weights": [0.5]}')
        )
        transition(run, RunState.FAILED, reason="furnished as failed")
        # Its evidence, sealed here (no worker runs): the export has something to answer.
        with override_settings(TAU_EVIDENCE_SIGNING_KEY=TEST_SIGNING_KEY):
            assert sealing.seal(SealRequest.objects.unscoped().get(run=run).pk)
    return alpha, beta


def _get(url: str, token: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.fixture
def contract(world: Any, tmp_path: Path, settings: Any) -> Iterator[Contract]:
    settings.VAR_DIR = tmp_path / "var"  # bundles, where the portal reads them too
    alpha_runs, beta_runs = _furnish(world)
    issued = {
        who: tokens.issue_token(user=world.users[who], name=f"contract-{who}").plaintext
        for who in IDENTITIES
        if who != "run"
    }
    attempt = RunAttempt.objects.unscoped().filter(run=alpha_runs[0]).order_by("-number")[0]
    run_token = run_tokens.issue_run_token(
        run=alpha_runs[0], attempt=attempt, max_runtime_seconds=None
    )
    assert run_token is not None
    issued["run"] = run_token
    # Submissions are written and queued; nothing delivers them (no worker), nothing runs.
    # schemathesis sends invalid credentials to every operation, in every phase, all from
    # this one address: past the per-address limit (30 in five minutes) the portal answers
    # 429 instead of 401, as it should (tests/identity/test_api_tokens.py), and the check
    # that bad credentials get nothing would see the limiter instead.
    unlimited = {"TAU_AUTH_FAILURES_PER_ADDRESS": "1000000", "TAU_AUTH_FAILURES_PER_KEY": "1000000"}
    # Production's web server and its database connections (the Helm chart's gunicorn, which
    # keeps a connection for TAU_DB_CONN_MAX_AGE): make run's uvicorn opens a PostgreSQL
    # connection for every request (a SCRAM handshake and a new backend with cold caches,
    # about 15 ms of the 20 ms an API request took), which was half of this test's time.
    production = {**unlimited, "TAU_DB_CONN_MAX_AGE": "60"}
    for portal in portal_processes(tmp_path, "filesystem://", extra_env=production, gunicorn=True):
        portal.start(worker=False, beat=False)
        status, body = _get(f"{portal.url}/api/v1/schema/?format=json", issued["viewer"])
        assert status == 200, body[:500]
        yield Contract(portal, issued, alpha_runs, beta_runs, json.loads(body))


#: Operations whose refusal of a well-formed request turns on what exists or on content the
#: schema cannot carry, where a 400 that says which is the right answer to a schema-valid
#: request (each refusal names the field): the tau.yaml inside the submitted file (checked
#: by the server's own checker; an endpoint's too), a checkpoint path inside this run's
#: folder, an artifact's name among the run's declared outputs.artifacts, a sweep trial's
#: values (their size), metric rows (names, values and the number of series per run), a
#: username someone may add, and the platform team's objects (names taken, flavors and
#: cohorts that must exist, node labels and tolerations by Kubernetes' rules, quantities).
#: Everything else answers a schema-valid request with no 400 at all.
STATE_DEPENDENT_400 = (
    "POST /api/v1/workspaces/{workspace_slug}/runs/",
    # An endpoint's tau.yaml, as a run's (the server's checker, ``run.workload_kind:
    # rayservice``, a ``serve`` block), the model version it names among those that exist,
    # the workspace's policy and what the backend could ever give it; a change's the same
    # (a new tau.yaml, another model version; that it names one change at all, the schema
    # says).
    "POST /api/v1/workspaces/{workspace_slug}/endpoints/",
    "PATCH /api/v1/workspaces/{workspace_slug}/endpoints/{name}/",
    # A pipeline's zip: its pipeline.yaml and every stage's tau.yaml, checked as a run's.
    "POST /api/v1/workspaces/{workspace_slug}/pipelines/",
    # The stages to run afresh must be the pipeline's own.
    "POST /api/v1/workspaces/{workspace_slug}/pipelines/{name}/resume/",
    "POST /api/v1/workspaces/{workspace_slug}/runs/{run_name}/report/checkpoints/",
    "POST /api/v1/workspaces/{workspace_slug}/runs/{run_name}/report/metrics/",
    "POST /api/v1/workspaces/{workspace_slug}/runs/{run_name}/report/artifacts/",
    # A trial's values: valid text, at most 16 KiB as JSON and 8 levels deep.
    "POST /api/v1/workspaces/{workspace_slug}/runs/{run_name}/report/trials/",
    "POST /api/v1/workspaces/{workspace_slug}/members/",
    # A webhook's URL must be http(s) and its host resolve to public addresses only.
    "POST /api/v1/workspaces/{workspace_slug}/webhooks/",
    "POST /api/v1/workspaces/",
    # The same as creating one: its quotas' flavors and its cohort must exist.
    "PATCH /api/v1/workspaces/{workspace_slug}/",
    "POST /api/v1/cohorts/",
    "PATCH /api/v1/cohorts/{name}/",
    "POST /api/v1/flavors/",
    "PATCH /api/v1/flavors/{name}/",
    # Datasets' and models' uploads: each declared path by the manifest's rules (no '..', no
    # hidden characters, each once), a piece's bytes against the declared SHA-256 and size,
    # an alias's version among those that exist (and ``latest``, the catalog's own).
    *(
        f"{method} /api/v1/workspaces/{{workspace_slug}}/{kind}s/{path}"
        for kind in ("dataset", "model")
        for method, path in (
            ("POST", "{name}/versions/"),
            ("PUT", "{name}/versions/{version}/files/{file_path}"),
            ("PUT", "{name}/aliases/{alias}/"),
            ("DELETE", "{name}/aliases/{alias}/"),
        )
    ),
)
#: The query a ``best`` read needs (which metric); the furnished versions record it.
BEST_QUERY = "?metric=val_loss"
#: Reads inside a workspace that only its admins may make (a chat's webhook URL is a
#: credential): the owner who reads them in the check below is the admin.
ADMIN_ONLY_READS = frozenset({"/api/v1/workspaces/{workspace_slug}/webhooks/"})
#: GETs inside a workspace that read none of its objects: the proxy's relay to a running
#: endpoint, which a token reaches only with the endpoints:invoke scope (these have none: 403
#: to its owner too; tests/serving/test_invoke.py covers who reaches it).
RELAYS = frozenset({"/api/v1/workspaces/{workspace_slug}/endpoints/{name}/invoke/{path}"})
#: What schemathesis expects of a schema-valid request by default, and the 400 above.
ACCEPTED_OR_REFUSED_ON_STATE = "[200, 201, 202, 204, 400, 401, 403, 404, 409, 429]"


def _schemathesis_config(contract: Contract, directory: Path) -> Path:
    auth = directory / "auth.json"
    auth.write_text(
        json.dumps(
            {
                "auth": [
                    {
                        "name": who,
                        "fixedHeaders": [
                            {"name": "Authorization", "value": f"Bearer {contract.tokens[who]}"}
                        ],
                    }
                    for who in IDENTITIES
                ]
            }
        )
    )
    auth.chmod(0o600)
    run_names = [run.name for run in contract.alpha_runs + contract.beta_runs]
    dictionaries = {
        "workspaces": ["alpha", "beta"],
        "runs": run_names + [run.spec_name for run in contract.alpha_runs],
        # Members whose change or removal takes no token's access away.
        "members": ["mia", "max", "bea"],
        # Each workspace's dataset, model, endpoint and pipeline: ``<slug>-wiki``.
        "assets": ["alpha-wiki", "beta-wiki"],
        "versions": ["1", "train", "latest"],
    }
    lines = [
        f"base-url = {json.dumps(contract.portal.url)}",
        # Hypothesis' lambda sources are not thread-safe: with two workers, schemathesis 4.32.5
        # stops the coverage phase of an operation with a Runtime Error ("AST constructor
        # recursion depth mismatch", hypothesis.internal.lambda_sources), and is no faster.
        "workers = 1",
        "seed = 1",
        "continue-on-failure = true",
        "[generation]",
        f"max-examples = {MAX_EXAMPLES}",
        # No example database: each run starts in an empty folder, so there is nothing to
        # replay, and keeping one made Hypothesis keep a Pareto front of every fuzzed case's
        # targets, about a sixth of the fuzzing phase's CPU, for a run that follows.
        'database = "none"',
        # Text with NUL is refused by every route (no database column stores it). The schema
        # says so for every string value (pattern); the keys of free-form objects (an event's
        # data, a trial's config) cannot say it in OpenAPI 3.0 (no propertyNames).
        "allow-x00 = false",
        "[auth.wfc]",
        f"path = {json.dumps(str(auth))}",
        # Two workspaces' tokens: neither may read what the other's reads. (The viewer, as
        # the first identity, is who every read is made as, so the one replayed.)
        'peers = ["viewer", "outsider"]',
        # A request the API refuses as too large (413, documented) is refused, not accepted.
        "[checks.negative_data_rejection]",
        "expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]",
        "[parameters]",
        '"path.workspace_slug" = { dictionary = "workspaces", probability = 0.9 }',
        '"path.run_name" = { dictionary = "runs", probability = 0.9 }',
        '"path.username" = { dictionary = "members", probability = 1.0 }',
        '"path.name" = { dictionary = "assets", probability = 0.9 }',
        '"path.version" = { dictionary = "versions", probability = 0.9 }',
    ]
    for name, values in dictionaries.items():
        lines += [f"[dictionaries.{name}]", f"values = {json.dumps(values)}"]
    for operation in STATE_DEPENDENT_400:
        lines += [
            "[[operations]]",
            f"include-name = {json.dumps(operation)}",
            f"checks.positive_data_acceptance.expected-statuses = {ACCEPTED_OR_REFUSED_ON_STATE}",
        ]
    config = directory / "schemathesis.toml"
    config.write_text("\n".join(lines) + "\n")
    return config


def test_schemathesis_finds_nothing(contract: Contract, tmp_path: Path) -> None:
    executable = ensure_schemathesis()
    work = tmp_path / "schemathesis"
    work.mkdir()
    schema = work / "openapi.json"
    schema.write_text(json.dumps(contract.schema))
    config = _schemathesis_config(contract, work)
    started = time.monotonic()
    result = subprocess.run(
        [
            str(executable),
            "--config-file",
            str(config),
            "run",
            str(schema),
            "--no-color",
            "--report",
            "ndjson",
            "--report-dir",
            str(work / "report"),
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_SECONDS,
        env={
            **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")},
            # Hypothesis' caches (its Unicode tables, 4 s of CPU to make) kept beside the venv,
            # not made again in each run's empty folder; there is no example database to keep.
            "HYPOTHESIS_STORAGE_DIRECTORY": str(executable.parent.parent / "hypothesis"),
        },
        check=False,
    )
    took = time.monotonic() - started
    output = result.stdout + result.stderr
    (work / "output.txt").write_text(output)
    summary = output[output.rfind("SUMMARY") :] if "SUMMARY" in output else output[-4000:]
    assert result.returncode == 0, f"schemathesis found problems ({took:.0f}s):\n{output[-20000:]}"
    # Every operation was reached, and with a role that it does not refuse.
    assert "Tested: " in summary, summary
    tested = re.search(r"Selected: (\d+)/(\d+)\s+Tested: (\d+)", summary)
    assert tested is not None, summary
    assert tested.group(3) == tested.group(2), summary
    assert contract.portal.processes["web"].poll() is None, contract.portal.log("web")[-3000:]


def _ending_event(run: Run) -> int:
    """The ending whose evidence record the run has (its owner reads that record)."""
    record = EvidenceRecord.objects.unscoped().filter(run=run).order_by("-terminal_seq").first()
    return record.terminal_seq if record is not None else 1


def _paths_with(schema: dict[str, Any], method: str) -> list[str]:
    return [path for path, item in schema["paths"].items() if method in item]


def test_a_token_never_reads_another_workspaces_objects(contract: Contract) -> None:
    """Every read inside a workspace, with each workspace's token and the other workspace's
    slug and ids: a 404 (the workspace cannot be seen) or a 403, never its data; the same read
    with the owner's token answers 200 (so the 404 is not just a wrong address). And with
    one's own workspace's slug and the other's ids (run names, spec names, usernames): a 404
    or a 403, never the other's object."""
    sides = (
        ("researcher", "beta", contract.beta_runs[1]),
        ("outsider", "alpha", contract.alpha_runs[1]),
        ("run", "beta", contract.beta_runs[1]),
    )
    owners = {"alpha": "researcher", "beta": "outsider"}
    # Reads only a workspace's admins may make: its owner there is its admin.
    admin_owners = {"alpha": "workspace_admin", "beta": "outsider"}
    members = {"alpha": "mia", "beta": "bea"}
    checked = 0
    for who, workspace, run in sides:
        for template in _paths_with(contract.schema, "get"):
            if "{workspace_slug}" not in template:
                continue
            path = (
                template.replace("{workspace_slug}", workspace)
                .replace("{run_name}", run.name)
                .replace("{username}", members[workspace])
                .replace("{artifact_path}", ARTIFACT)
                .replace("{sha256}", hashlib.sha256(DATA_FILE).hexdigest())
                .replace("{ending_event}", str(_ending_event(run)))
                .replace("{name}", f"{workspace}-wiki")
                .replace("{version}", "train")
            )
            path += BEST_QUERY if template.endswith("/best/") else ""
            url = f"{contract.portal.url}{path}"
            status, body = _get(url, contract.tokens[who])
            assert status in (403, 404), (who, path, status, body[:300])
            assert run.name.encode() not in body, (who, path, body[:300])
            if who != "run" and template not in RELAYS:
                owner = (admin_owners if template in ADMIN_ONLY_READS else owners)[workspace]
                owner_status, _ = _get(url, contract.tokens[owner])
                assert owner_status == 200, (owner, path, owner_status)
            checked += 1
    assert checked >= 3 * 9
    # The other workspace's ids under one's own workspace: no such object (the run's spec
    # name too, which names the newest run of that spec).
    for who, own, foreign_run, foreign_member in (
        ("researcher", "alpha", contract.beta_runs[1], "bea"),
        ("outsider", "beta", contract.alpha_runs[1], "mia"),
        ("run", "alpha", contract.beta_runs[1], "bea"),
    ):
        for name in (foreign_run.name, foreign_run.spec_name):
            for template in _paths_with(contract.schema, "get"):
                if not any(field in template for field in ("{run_name}", "{username}", "{name}")):
                    continue
                foreign = "beta" if own == "alpha" else "alpha"
                path = (
                    template.replace("{workspace_slug}", own)
                    .replace("{run_name}", name)
                    .replace("{username}", foreign_member)
                    .replace("{artifact_path}", ARTIFACT)
                    .replace("{sha256}", hashlib.sha256(DATA_FILE).hexdigest())
                    .replace("{ending_event}", str(_ending_event(foreign_run)))
                    .replace("{name}", f"{foreign}-wiki")
                    .replace("{version}", "1")
                )
                path += BEST_QUERY if template.endswith("/best/") else ""
                status, body = _get(f"{contract.portal.url}{path}", contract.tokens[who])
                assert status in (403, 404), (who, path, status, body[:300])
                # A refusal and nothing else (it may repeat the name it was given).
                assert set(json.loads(body)) == {"detail"}, (who, path, body[:300])
                assert foreign_run.spec_hash.encode() not in body
                checked += 1
    # And listings: the other workspace's runs never appear in one's own.
    status, body = _get(
        f"{contract.portal.url}/api/v1/workspaces/alpha/runs/", contract.tokens["researcher"]
    )
    assert status == 200
    assert not any(run.name.encode() in body for run in contract.beta_runs)
    status, body = _get(f"{contract.portal.url}/api/v1/workspaces/", contract.tokens["outsider"])
    assert status == 200
    assert [row["slug"] for row in json.loads(body)] == ["beta"]
