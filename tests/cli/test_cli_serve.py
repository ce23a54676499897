"""``tau serve`` against a live portal (issue 34): an endpoint deployed from a project folder,
followed until ready, scaled, its log read and followed, invoked through the portal's proxy
with a token that has the ``endpoints:invoke`` scope (a real HTTP server on 127.0.0.1 stands
in for the Ray Serve port), then deleted; the model a fine-tuning run registered deployed with
``--from-finetune`` (or else its newest checkpoint, registered first), and a clear refusal
when it has neither; ``--model NAME@VERSION``; the JSON scripts read and every exit code."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalog.ingest import asset_named, ingest_folder
from catalog.models import Asset, AssetVersion
from executors.local import backend as local_backend
from identity import tokens
from runs.models import Checkpoint, Run, RunState
from serving import services
from serving.backends import EndpointLog
from serving.models import Endpoint, EndpointState
from tests.cli.test_cli_members import TAU, Tau, as_user
from tests.runs.factories import TINY_SPEC, make_run
from tests.serving import fakes
from tests.serving.factories import (
    AUTOSCALING_SPEC,
    ENDPOINT_SPEC,
    RUN_SPEC,
    make_endpoint,
    model_version,
)
from tests.serving.upstream import upstream_server

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

#: Each replica's log as the backend below has it; tests append to it.
LOGS: dict[str, str] = {}
#: The replica the backend reads by default (the one that serves).
SHOWN: list[str] = []


class LoggingEndpoints(fakes.FakeEndpoints):
    """The serving tests' fake, with logs that grow and are read from an offset as the real
    backends read them, so that following one can be told from reading it again."""

    def read_log(
        self,
        endpoint: Endpoint,
        *,
        offset: int | None,
        tail_lines: int | None,
        replica: str | None = None,
    ) -> EndpointLog:
        chosen = replica if replica in LOGS else SHOWN[0]
        data = LOGS[chosen].encode()
        start = 0 if offset is None else min(offset, len(data))
        return EndpointLog(
            text=data[start:].decode(),
            offset=start,
            next_offset=len(data),
            size=len(data),
            replica=chosen,
            replicas=tuple(LOGS),
        )


class LocalServing(fakes.LocalWithEndpoints):
    endpoints = LoggingEndpoints()


@pytest.fixture(autouse=True)
def endpoint_backend(settings: Any) -> Iterator[None]:
    settings.TAU_BACKEND_CLASSES = {
        **settings.TAU_BACKEND_CLASSES,
        "local": f"{__name__}.LocalServing",
    }
    fakes.reset()
    LOGS.clear()
    LOGS["generation-1"] = "serving requests\n"
    SHOWN[:] = ["generation-1"]
    yield
    fakes.reset()


def invoker(world: Any, live_server: Any, home: Path, who: str = "researcher") -> Tau:
    """``tau`` with a token that may also invoke endpoints."""
    issued = tokens.issue_token(user=world.users[who], name="cli", scopes=["endpoints:invoke"])
    return Tau(live_server.url, issued.plaintext, home)


def project(tmp_path: Path, spec: bytes = ENDPOINT_SPEC, *, app: bool = True) -> Path:
    """A project folder with the endpoint's tau.yaml and its application; the tau.yaml."""
    folder = tmp_path / "project"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tau.yaml").write_bytes(spec)
    if app:
        (folder / "app.py").write_text("deployment = None\n")
    return folder / "tau.yaml"


def endpoints(world: Any) -> Any:
    return Endpoint.objects.for_workspace(world.alpha).filter(deleted_at__isnull=True)


def wait_for(done: subprocess.Popen[str], *, seconds: float = 60) -> tuple[str, str]:
    try:
        return done.communicate(timeout=seconds)
    finally:
        done.kill()


def test_deploy_follow_scale_logs_invoke_and_delete(
    world: Any, live_server: Any, tmp_path: Path
) -> None:
    tau = invoker(world, live_server, tmp_path / "home")
    config = project(tmp_path)

    deployed = tau.json("serve", "deploy", "--config", str(config))
    assert deployed["name"] == "chat"
    assert deployed["state"] == "deploying"
    assert (deployed["replicas_desired"], deployed["model"], deployed["generation"]) == (1, None, 1)
    assert deployed["invoke_url"] == "/api/v1/workspaces/alpha/endpoints/chat/invoke/"
    endpoint = endpoints(world).get(name="chat")
    # The tau.yaml as written (nothing to change in it), and the project's zip with it: the
    # application's module travelled (the portal refuses a zip without it, below).
    assert endpoint.spec_source == ENDPOINT_SPEC.decode()
    assert endpoint.bundle is not None
    assert endpoint.bundle.file_count == 2

    assert [row["name"] for row in tau.json("serve", "list")] == ["chat"]
    table = tau("serve", "list")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0] == "Endpoints in alpha"
    assert "chat" in table.stdout
    assert "deploying" in table.stdout

    # --watch follows it until it is ready, one JSON line per change, and exits 0.
    watching = subprocess.Popen(
        [str(TAU), "serve", "status", "chat", "--watch", "--json"],
        env=tau.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.5)
    with upstream_server() as upstream:
        services.observe(endpoint, state=EndpointState.READY, replicas_ready=1, url="http://x")
        fakes.BEHAVIOUR.address = upstream.address
        stdout, stderr = wait_for(watching)
        assert watching.returncode == 0, stderr
        states = [json.loads(line)["state"] for line in stdout.splitlines()]
        assert states == ["deploying", "ready"]

        status = tau("serve", "status", "chat")
        assert status.returncode == 0, status.stderr
        assert status.stdout.splitlines()[0] == "chat  ready"
        assert "  replicas:     1/1 ready" in status.stdout
        assert (
            f"  invoke:       {live_server.url}/api/v1/workspaces/alpha/endpoints/chat/invoke/"
            in (status.stdout)
        )

        # Inline data, then a file: sent as JSON to the path asked, the answer printed.
        said = tau("serve", "invoke", "chat", "--path", "echo?x=1", "--data", '{"text": "hi"}')
        assert (said.returncode, said.stdout) == (0, '{"text": "hi"}'), said.stderr
        request = tmp_path / "request.json"
        request.write_text('{"text": "a wonderful, moving film"}')
        answered = tau.json("serve", "invoke", "chat", "--data", f"@{request}")
        assert answered == {
            "status": 200,
            "content_type": "application/json",
            "body": {"text": "a wonderful, moving film"},
        }
        assert [(seen["path"], seen["content_type"]) for seen in upstream.seen] == [
            ("/echo?x=1", "application/json"),
            ("/", "application/json"),
        ]
        # Its own error: passed on, printed, exit 1.
        teapot = tau("serve", "invoke", "chat", "--path", "teapot")
        assert teapot.returncode == 1
        assert json.loads(teapot.stdout) == {"error": "I am a teapot"}
        assert teapot.stderr == "chat answered 418.\n"
        # A token without the endpoints:invoke scope: refused by the portal, exit 3.
        plain = as_user(world, "researcher", live_server, tmp_path / "plain")
        refused = plain("serve", "invoke", "chat", "--data", "{}")
        assert refused.returncode == 3
        assert "endpoints:invoke" in refused.stderr
        assert len(upstream.seen) == 3

    scaled = tau.json("serve", "scale", "chat", "--replicas", "2")
    assert (scaled["replicas_desired"], scaled["generation"]) == (2, 2)
    assert endpoints(world).get(name="chat").replicas_desired == 2

    logs = tau("serve", "logs", "chat")
    assert (logs.returncode, logs.stdout) == (0, "serving requests\n"), logs.stderr
    piece = tau.json("serve", "logs", "chat", "--replica", "generation-1")
    assert (piece["replica"], piece["replicas"], piece["next_offset"]) == (
        "generation-1",
        ["generation-1"],
        len("serving requests\n"),
    )

    deleted = tau.json("serve", "delete", "chat")
    assert deleted == {"workspace": "alpha", "name": "chat", "deleted": True}
    assert not endpoints(world).exists()
    assert tau.json("serve", "list") == []
    gone = tau("serve", "status", "chat")
    assert gone.returncode == 4
    assert gone.stderr == "tau: not found: This workspace has no endpoint named 'chat'.\n"


def test_logs_follow_prints_what_is_new_moves_to_a_new_generation_and_ends_when_stopped(
    world: Any, live_server: Any, tmp_path: Path
) -> None:
    endpoint = make_endpoint(world, state=EndpointState.READY)
    tau = as_user(world, "researcher", live_server, tmp_path / "home")
    following = subprocess.Popen(
        [str(TAU), "serve", "logs", "chat", "-f"],
        env=tau.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.5)
    LOGS["generation-1"] += "request 1\n"
    time.sleep(2.5)
    # A new generation serves: its log is followed from its start.
    LOGS["generation-2"] = "generation 2 starts\n"
    SHOWN[:] = ["generation-2"]
    time.sleep(2.5)
    services.stop_endpoint(endpoint=endpoint, user=world.users["researcher"])
    stdout, stderr = wait_for(following)
    assert following.returncode == 0, stderr
    assert stdout == "serving requests\nrequest 1\ngeneration 2 starts\n"
    assert stderr == "--- generation-2 ---\nchat is stopped.\n"


def test_exit_codes_and_the_words_of_each_refusal(
    world: Any, live_server: Any, tmp_path: Path
) -> None:
    tau = invoker(world, live_server, tmp_path / "home")

    missing = tau("serve", "status", "nothing", "--json")
    assert missing.returncode == 4
    assert json.loads(missing.stdout)["exit_code"] == 4
    assert tau("serve", "delete", "nothing").returncode == 4
    assert tau("serve", "invoke", "nothing", "--data", "{}").returncode == 4

    endpoint = make_endpoint(world, state=EndpointState.READY)
    for bad in ("0", "65", "two"):
        scaled = tau("serve", "scale", "chat", "--replicas", bad)
        assert scaled.returncode == 2, bad
        assert "--replicas" in scaled.stderr
    assert endpoints(world).get().generation == 1

    not_json = tau("serve", "invoke", "chat", "--data", "text=hi")
    assert not_json.returncode == 2
    assert "is not JSON" in not_json.stderr
    assert "--content-type" in not_json.stderr
    unreadable = tau("serve", "invoke", "chat", "--data", f"@{tmp_path / 'none.json'}")
    assert unreadable.returncode == 2
    assert "cannot read it" in unreadable.stderr

    # Stopped: invoke is refused with its state, and so is reading its log.
    services.stop_endpoint(endpoint=endpoint, user=world.users["researcher"])
    stopped = tau("serve", "invoke", "chat", "--data", "{}")
    assert (stopped.returncode, stopped.stdout) == (1, "")
    assert stopped.stderr == (
        "tau: chat is stopped: it answers no requests now (`tau serve status chat`).\n"
    )
    said = tau("serve", "invoke", "chat", "--data", "{}", "--json")
    assert said.returncode == 1
    assert json.loads(said.stdout)["details"]["state"] == "stopped"
    logs = tau("serve", "logs", "chat")
    assert logs.returncode == 1
    assert logs.stderr == "tau: chat is stopped: nothing of it runs, so it has no log to read.\n"
    # --watch of a stopped endpoint: it has settled, not ready (exit 1).
    assert tau("serve", "status", "chat", "--watch").returncode == 1

    # One that autoscales is not scaled by hand.
    make_endpoint(world, spec=AUTOSCALING_SPEC, name="auto", state=EndpointState.READY)
    autoscaled = tau("serve", "scale", "auto", "--replicas", "2")
    assert autoscaled.returncode == 1
    assert "scales itself (serve.autoscaling)" in autoscaled.stderr

    # Deploying: a run's tau.yaml, a name in use, a project without its application.
    run_config = project(tmp_path / "run", RUN_SPEC)
    not_endpoint = tau("serve", "deploy", "--config", str(run_config))
    assert not_endpoint.returncode == 2
    assert "describes a run, not an endpoint" in not_endpoint.stderr
    both = tau(
        "serve", "deploy", "--config", str(run_config), "--model", "a@1", "--from-finetune", "r"
    )
    assert both.returncode == 2
    taken = tau("serve", "deploy", "--config", str(project(tmp_path / "again")))
    assert taken.returncode == 1
    assert "This workspace has an endpoint named 'chat' already." in taken.stderr
    assert "`tau serve delete chat`" in taken.stderr
    renamed = ENDPOINT_SPEC.replace(b"name: chat", b"name: no-app")
    without_app = tau(
        "serve", "deploy", "--config", str(project(tmp_path / "bare", renamed, app=False))
    )
    assert without_app.returncode == 2
    assert ": serve.import_path: " in without_app.stderr
    autoscaling = project(tmp_path / "scaling", AUTOSCALING_SPEC.replace(b"chat", b"other"))
    fixed = tau("serve", "deploy", "--config", str(autoscaling), "--replicas", "2")
    assert fixed.returncode == 2
    assert "autoscales" in fixed.stderr
    assert sorted(endpoints(world).values_list("name", flat=True)) == ["auto", "chat"]


def test_model_name_at_version_and_replicas_change_what_is_deployed(
    world: Any, live_server: Any, tmp_path: Path
) -> None:
    model_version(world, tmp_path)  # tiny-gpt@1, alias production
    tau = as_user(world, "researcher", live_server, tmp_path / "home")
    config = project(tmp_path)

    unknown = tau("serve", "deploy", "--config", str(config), "--model", "tiny-gpt@9", "--json")
    assert unknown.returncode == 2
    refusal = json.loads(unknown.stdout)
    assert [problem["path"] for problem in refusal["details"]["problems"]] == [
        "serve.model.version"
    ]
    assert not endpoints(world).exists()

    deployed = tau(
        "serve",
        "deploy",
        "--config",
        str(config),
        "--model",
        "tiny-gpt@production",
        "--replicas",
        "3",
    )
    assert deployed.returncode == 0, deployed.stderr
    assert deployed.stdout == (
        "Deployed chat to alpha (deploying): 3 replicas, model tiny-gpt@1.\n"
        "Follow it: tau serve status chat --watch\n"
    )
    endpoint = endpoints(world).get(name="chat")
    assert endpoint.model_version is not None
    assert (endpoint.model_version.asset.name, endpoint.model_version.number) == ("tiny-gpt", 1)
    assert endpoint.replicas_desired == 3
    assert endpoint.spec["serve"]["model"] == {"name": "tiny-gpt", "version": "production"}
    assert tau.json("serve", "status", "chat")["model"] == {"name": "tiny-gpt", "version": 1}


def test_from_finetune_deploys_the_version_the_run_registered(
    world: Any, live_server: Any, tmp_path: Path
) -> None:
    trained = TINY_SPEC + b"outputs:\n  model: {name: reviews, path: model}\n"
    run = make_run(world, spec=trained, state=RunState.SUCCEEDED)
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "model.bin").write_bytes(b"fine-tuned")
    reviews = asset_named(world.alpha, "model", "reviews")
    made = ingest_folder(reviews, weights, source=AssetVersion.Source.RUN, produced_by=run)
    # A newer version the run did not make: `latest` would name it, the run's is 1.
    (weights / "model.bin").write_bytes(b"another")
    ingest_folder(reviews, weights, source="prefix")
    assert made.number == 1
    config = project(
        tmp_path,
        ENDPOINT_SPEC.replace(
            b"  replicas: 1\n", b"  replicas: 1\n  model: {name: reviews, version: latest}\n"
        ),
    )
    tau = as_user(world, "researcher", live_server, tmp_path / "home")

    deployed = tau("serve", "deploy", "--config", str(config), "--from-finetune", run.name)
    assert deployed.returncode == 0, deployed.stderr
    assert deployed.stdout.splitlines()[0] == (
        f"Deployed chat to alpha (deploying): 1 replica, model reviews@1, made by {run.name}."
    )
    endpoint = endpoints(world).get(name="chat")
    assert endpoint.model_version_id == made.pk
    tau.json("serve", "delete", "chat")

    # By its spec name (its newest run), with --json.
    again = tau.json("serve", "deploy", "--config", str(config), "--from-finetune", "tiny")
    assert again["model"] == {"name": "reviews", "version": 1}

    # A run without outputs.model whose artifacts were registered (`tau data model register
    # --run`): found among the workspace's models.
    other = make_run(world, state=RunState.SUCCEEDED)
    registered = ingest_folder(
        asset_named(world.alpha, "model", "bert"),
        weights,
        source=AssetVersion.Source.RUN,
        produced_by=other,
    )
    renamed = project(tmp_path / "bert", ENDPOINT_SPEC.replace(b"name: chat", b"name: bert"))
    found = tau.json("serve", "deploy", "--config", str(renamed), "--from-finetune", other.name)
    assert found["model"] == {"name": "bert", "version": registered.number}


def test_from_finetune_of_a_run_that_registered_no_model_deploys_nothing(
    world: Any, live_server: Any, tmp_path: Path
) -> None:
    tau = as_user(world, "researcher", live_server, tmp_path / "home")
    config = project(tmp_path)
    plain = make_run(world, state=RunState.SUCCEEDED)
    none = tau("serve", "deploy", "--config", str(config), "--from-finetune", plain.name)
    assert (none.returncode, none.stdout) == (4, "")
    assert none.stderr == (
        f"tau: {plain.name} registered no model version (its tau.yaml has no outputs.model) "
        "and wrote no checkpoint; nothing was deployed. Make one of what it kept with `tau "
        f"data model register NAME --run {plain.name} --path PATH`, then deploy it with `tau "
        "serve deploy --model NAME@VERSION`.\n"
    )

    trained = TINY_SPEC + b"outputs:\n  model: {name: reviews, path: model}\n"
    failed = make_run(world, spec=trained, state=RunState.FAILED)
    refused = tau("serve", "deploy", "--config", str(config), "--from-finetune", failed.name)
    assert refused.returncode == 4
    assert refused.stderr == (
        f"tau: {failed.name} is failed: a run registers outputs.model (reviews) only when it "
        "succeeds, and it wrote no checkpoint to serve instead; nothing was deployed.\n"
    )
    # Only an unfinished checkpoint: none to serve either.
    Checkpoint.objects.create(run=failed, attempt=1, step=5, path="/nowhere", complete=False)
    unfinished = tau("serve", "deploy", "--config", str(config), "--from-finetune", failed.name)
    assert unfinished.returncode == 4
    assert "and it wrote no complete checkpoint to serve instead" in unfinished.stderr
    nobody = tau("serve", "deploy", "--config", str(config), "--from-finetune", "no-such-run")
    assert nobody.returncode == 4
    assert not endpoints(world).exists()
    assert not Asset.objects.for_workspace(world.alpha).exists()


def checkpoint_of(run: Run, step: int, weights: bytes) -> Path:
    """A complete checkpoint folder of the run, as the local agent records one."""
    where = local_backend.checkpoint_dir(run) / f"step-{step}"
    where.mkdir(parents=True)
    (where / "model.bin").write_bytes(weights)
    Checkpoint.objects.create(run=run, attempt=1, step=step, path=str(where))
    return where


def test_from_finetune_of_a_run_that_registered_no_model_serves_its_newest_checkpoint(
    world: Any, live_server: Any, tmp_path: Path
) -> None:
    tau = as_user(world, "researcher", live_server, tmp_path / "home")
    config = project(tmp_path)
    # A fine-tune that was cancelled before it could register outputs.model: its newest
    # complete checkpoint becomes the next version of that model, and is deployed.
    trained = TINY_SPEC + b"outputs:\n  model: {name: reviews, path: model}\n"
    cancelled = make_run(world, spec=trained, state=RunState.CANCELLED)
    checkpoint_of(cancelled, 10, b"early")
    checkpoint_of(cancelled, 20, b"later")
    deployed = tau("serve", "deploy", "--config", str(config), "--from-finetune", cancelled.name)
    assert deployed.returncode == 0, deployed.stderr
    assert deployed.stdout.splitlines()[:2] == [
        f"Registered {cancelled.name}'s checkpoint step 20 as reviews@1.",
        "Deployed chat to alpha (deploying): 1 replica, model reviews@1, made by "
        f"{cancelled.name}.",
    ]
    version = AssetVersion.objects.for_workspace(world.alpha).get(asset__name="reviews")
    assert (version.number, version.state, version.produced_by_id) == (1, "ready", cancelled.pk)
    assert version.source_detail == f"{cancelled.name}: checkpoint step 20"
    assert endpoints(world).get(name="chat").model_version_id == version.pk
    tau.json("serve", "delete", "chat")
    # Deployed again, the run has registered a version: that one is served, none is made.
    again = tau.json("serve", "deploy", "--config", str(config), "--from-finetune", cancelled.name)
    assert again["model"] == {"name": "reviews", "version": 1}
    assert AssetVersion.objects.for_workspace(world.alpha).count() == 1
    tau.json("serve", "delete", "chat")

    # Without outputs.model, a model named after the run is made; --json keeps standard
    # output for the endpoint and says what was registered on standard error.
    plain = make_run(world, state=RunState.SUCCEEDED)
    checkpoint_of(plain, 7, b"weights")
    made = tau("serve", "deploy", "--config", str(config), "--from-finetune", plain.name, "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["model"] == {"name": plain.name, "version": 1}
    assert f"Registered {plain.name}'s checkpoint step 7 as {plain.name}@1." in made.stderr
    tau.json("serve", "delete", "chat")

    # A checkpoint the portal refuses (gone from disk): its words, nothing deployed, and no
    # model made for it.
    gone = make_run(world, state=RunState.FAILED)
    folder = checkpoint_of(gone, 3, b"deleted")
    (folder / "model.bin").unlink()
    folder.rmdir()
    refused = tau("serve", "deploy", "--config", str(config), "--from-finetune", gone.name)
    assert refused.returncode == 2
    assert refused.stderr.startswith(
        f"tau: {gone.name} registered no model version, and its checkpoint step 3 could not be "
        f"registered as a version of {gone.name}: {gone.name}'s checkpoint at step 3 is gone "
        "from this machine"
    )
    assert refused.stderr.endswith(" Nothing was deployed.\n")
    assert not Asset.objects.for_workspace(world.alpha).filter(name=gone.name).exists()
    assert not endpoints(world).exists()
