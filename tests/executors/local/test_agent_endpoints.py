"""Endpoints served for real on the local executor (issue 34): a real agent (``manage.py
run_agent``) runs examples/serve-cpu as a Ray Serve application on this machine's loopback,
with Ray Serve installed from the wheels make test downloads (deploy/dev/example_wheels.py),
serving a model version registered in the catalog; the portal's services deploy, scale,
update and stop it, its deliveries are made as the Celery task makes them, and requests go
to the address the agent reports and through the portal's proxy route (a live server).

One Ray start costs 10-20 s here, so the life of one endpoint is one test: deployed, asked,
scaled, updated, followed by a new agent, started again after its process died, measured,
stopped."""

from __future__ import annotations

import io
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from catalog.ingest import asset_named, ingest_folder
from catalog.models import AssetVersion
from executors.local.agent import processes
from executors.local.agent.endpoint_files import EndpointFolder, process_record, read_record
from identity import tokens
from runs.models import RunState
from serving import delivery, services
from serving.models import (
    Endpoint,
    EndpointDelivery,
    EndpointEvent,
    EndpointEventKind,
    EndpointState,
)
from tests.executors.local.agent_harness import (
    Agent,
    spec,
    submit,
    wait_for_state,
    wait_until,
)
from tests.executors.local.test_agent_examples import EXAMPLES
from tests.executors.local.test_agent_workers import (
    EXAMPLE_WHEELS_SCRIPT,
    FIRST_INSTALL_SECONDS,
    RUN_VENVS,
    example_wheels,
)
from tests.runs.factories import zip_directory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EXAMPLE = EXAMPLES / "serve-cpu"
API = "/api/v1/workspaces/alpha/endpoints"
#: A generation that starts on an installed environment: Ray, then Ray Serve, then replicas.
START_SECONDS = 120
POSITIVE = {"text": "a good film"}


@pytest.fixture(autouse=True)
def deliveries_by_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoints' deliveries are made by the test (``deliver_all``), not by a Celery
    worker of another test database."""
    monkeypatch.setattr(delivery, "publish", lambda delivery_id: None)


@pytest.fixture
def endpoints_left(var_dir: Path) -> Iterator[None]:
    """An endpoint outlives its agent by design: whatever a test leaves serving is stopped
    after it (its process groups, by the leaders the agent recorded)."""
    yield
    for record in (var_dir / "endpoints").glob("*/generation-*/process.json"):
        data = read_record(record) or {}
        pid, ticks = data.get("pid"), data.get("start_ticks")
        if isinstance(pid, int) and processes.is_same_process(pid, ticks):
            processes.stop_group(pid, grace=5)


#: The machine the agent and the portal see: room for an update's two generations of two
#: replicas side by side (a logical budget: Ray's CPUs are not cores).
MACHINE = {"TAU_LOCAL_CPUS": "4", "TAU_LOCAL_MEMORY": "8Gi"}


@pytest.fixture(autouse=True)
def machine(settings: Any) -> None:
    """The portal's view of this machine (what deploy and submission check) is the agent's."""
    settings.TAU_LOCAL_CPUS = int(MACHINE["TAU_LOCAL_CPUS"])
    settings.TAU_LOCAL_MEMORY = MACHINE["TAU_LOCAL_MEMORY"]


def serving_agent(start_agent: Any, **env: str) -> Agent:
    wheels = example_wheels.wheel_dir()
    assert example_wheels.is_complete(wheels), f"run {EXAMPLE_WHEELS_SCRIPT} first"
    agent: Agent = start_agent(
        TAU_LOCAL_VENVS_DIR=str(RUN_VENVS), PIP_FIND_LINKS=str(wheels), **MACHINE, **env
    )
    return agent


def reviews_model(world: Any, tmp_path: Path, *, good: float) -> AssetVersion:
    """A version of alpha's ``reviews-classifier`` as examples/train-on-data writes it:
    weights over a three-word vocabulary; ``good`` is the weight of "good"."""
    folder = tmp_path / f"model-{good}"
    folder.mkdir()
    (folder / "model.json").write_text(json.dumps({"weights": [good, -good, 0.0], "bias": 0.0}))
    (folder / "vocab.txt").write_text("good\nbad\nfilm\n")
    asset = asset_named(world.alpha, "model", "reviews-classifier", user=world.users["researcher"])
    version = ingest_folder(asset, folder, source="upload", user=world.users["researcher"])
    assert version.state == AssetVersion.State.READY, version.error
    return version


def deliver_all(endpoint: Endpoint) -> None:
    """What the Celery task does with every instruction written for the endpoint."""
    for pk in (
        EndpointDelivery.objects.for_workspace(endpoint.workspace_id)
        .filter(endpoint=endpoint, delivered_at__isnull=True, given_up_at__isnull=True)
        .order_by("pk")
        .values_list("pk", flat=True)
    ):
        delivery.deliver(pk)


def deploy(world: Any, source: bytes) -> Endpoint:
    endpoint = services.deploy_endpoint(
        workspace=world.alpha,
        user=world.users["researcher"],
        spec_source=source,
        bundle=io.BytesIO(zip_directory(EXAMPLE)),
    )
    deliver_all(endpoint)
    return endpoint


def fresh(endpoint: Endpoint) -> Endpoint:
    endpoint.refresh_from_db()
    return endpoint


def wait_for(
    endpoint: Endpoint, agent: Agent, *, timeout: float = START_SECONDS, **wanted: Any
) -> Endpoint:
    def matches() -> bool:
        fresh(endpoint)
        return all(getattr(endpoint, key) == value for key, value in wanted.items())

    try:
        wait_until(matches, timeout=timeout, what=f"{endpoint.name} with {wanted}", agent=agent)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{how_it_is(endpoint)}") from None
    return endpoint


def how_it_is(endpoint: Endpoint) -> str:
    """For a failed assertion: the endpoint's state and the tail of each generation's log."""
    fresh(endpoint)
    lines = [f"{endpoint.name}: {endpoint.state} (generation {endpoint.generation}): "]
    lines.append(endpoint.state_reason)
    folder = EndpointFolder.of(endpoint.pk)
    for number in folder.generations():
        log = folder.generation(number).log
        tail = log.read_text(errors="replace").splitlines()[-25:] if log.exists() else []
        lines += [f"--- generation {number}:", *tail]
    return "\n".join(lines)


def ask(url: str, text: str = POSITIVE["text"], **headers: str) -> httpx.Response:
    return httpx.post(url, json={"text": text}, headers=headers, timeout=10, trust_env=False)


def refused(url: str) -> bool:
    """Nothing listens at ``url`` any more (while it stops, it may still hang up instead)."""
    try:
        ask(url)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False
    return False


class Requests(threading.Thread):
    """A loop of requests through the portal's proxy route, each answer kept."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.token = token
        self.answers: list[tuple[int, str]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        with httpx.Client(trust_env=False, timeout=15) as client:
            while not self.stopped.is_set():
                try:
                    response = client.post(
                        self.url,
                        json=POSITIVE,
                        headers={"Authorization": f"Bearer {self.token}"},
                    )
                    self.answers.append((response.status_code, response.text))
                except httpx.HTTPError as exc:
                    self.answers.append((0, repr(exc)))
                time.sleep(0.05)

    def __enter__(self) -> Requests:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.join(timeout=30)

    def failures(self) -> list[tuple[int, str]]:
        return [answer for answer in self.answers if answer[0] != 200]

    def labels(self) -> set[int]:
        return {json.loads(text)["label"] for status, text in self.answers if status == 200}


def generation_pid(endpoint: Endpoint, number: int) -> int:
    record = read_record(process_record(EndpointFolder.of(endpoint.pk).generation(number)))
    assert record is not None
    pid = record["pid"]
    assert isinstance(pid, int)
    return pid


def descendants(root: int) -> set[int]:
    """``root`` and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def listening(pids: set[int]) -> list[str]:
    """The local addresses of the TCP sockets these processes listen on (``ss``)."""
    shown = subprocess.run(
        ["ss", "-ltnpH"], capture_output=True, text=True, check=True, timeout=10
    ).stdout
    return [
        line.split()[3]
        for line in shown.splitlines()
        if pids & {int(pid) for pid in re.findall(r"pid=(\d+)", line)}
    ]


def on_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host.startswith(("127.", "::ffff:127.")) or host == "::1"


def test_the_serve_cpu_example_is_served_scaled_updated_followed_and_stopped(
    world: Any,
    var_dir: Path,
    tmp_path: Path,
    start_agent: Any,
    live_server: Any,
    endpoints_left: None,
) -> None:
    """examples/serve-cpu as written, on the model version of the catalog it names (latest):
    ready at 127.0.0.1 and a port of its own, answered directly and through the proxy route
    with a token; scaled to 2 replicas (generation 2) and updated to a new model version
    (generation 3) while a loop of requests goes through the proxy, none failing and the
    answers changing with the model; still served by its processes while no agent runs and
    followed again by the next agent; started again after its processes died while no agent
    watched, saying so; its traffic measured from Ray Serve's own metrics; stopped, its port
    closed and its share of the machine given to a waiting run."""
    likes_good = reviews_model(world, tmp_path, good=3.0)
    timings: dict[str, float] = {}
    began = time.monotonic()
    endpoint = deploy(world, (EXAMPLE / "tau.yaml").read_bytes())
    assert endpoint.model_version == likes_good
    agent = serving_agent(start_agent)
    # The first start installs Ray Serve from the wheels (once per machine), then starts it.
    wait_for(endpoint, agent, timeout=FIRST_INSTALL_SECONDS, state=EndpointState.READY)
    timings["ready"] = time.monotonic() - began
    first_url = endpoint.url
    assert first_url.startswith("http://127.0.0.1:")
    # Ray, Ray Serve and the replica listen on loopback only: the replica's gRPC server, which
    # Ray Serve binds on every interface, too (the SDK's worker setup hook).
    addresses = listening(descendants(generation_pid(endpoint, 1)))
    assert len(addresses) > 5, addresses
    assert [address for address in addresses if not on_loopback(address)] == []
    assert (endpoint.replicas_ready, endpoint.replicas_desired) == (1, 1)
    answer = ask(first_url + "/")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"positive": 0.952574, "label": 1, "words": 2}

    # Through the portal, with a token that may invoke.
    issued = tokens.issue_token(
        user=world.users["researcher"], name="invoker", scopes=["endpoints:invoke"]
    )
    invoke = f"{live_server.url}{API}/{endpoint.name}/invoke/"
    proxied = ask(invoke, Authorization=f"Bearer {issued.plaintext}")
    assert proxied.status_code == 200, proxied.text
    assert proxied.json()["label"] == 1

    # Scale to 2: generation 2 starts beside generation 1 and takes over; no request fails.
    began = time.monotonic()
    with Requests(invoke, issued.plaintext) as loop:
        services.scale_endpoint(endpoint=endpoint, user=world.users["researcher"], replicas=2)
        deliver_all(endpoint)
        wait_for(endpoint, agent, generation=2, state=EndpointState.READY, replicas_ready=2)
        second_url = endpoint.url
        assert second_url != first_url
        wait_until(lambda: refused(first_url), timeout=30, what="generation 1 stopped")
        time.sleep(1)
    timings["scale"] = time.monotonic() - began
    assert loop.failures() == [], loop.failures()[:5]
    assert len(loop.answers) > 20
    assert loop.labels() == {1}

    # A new model version that dislikes "good": the answers change once generation 3 serves.
    dislikes_good = reviews_model(world, tmp_path, good=-3.0)
    began = time.monotonic()
    with Requests(invoke, issued.plaintext) as loop:
        services.update_endpoint(
            endpoint=endpoint,
            user=world.users["researcher"],
            model=services.ModelChoice("reviews-classifier", str(dislikes_good.number)),
        )
        deliver_all(endpoint)
        assert fresh(endpoint).state == EndpointState.UPDATING
        wait_for(endpoint, agent, generation=3, state=EndpointState.READY, replicas_ready=2)
        third_url = endpoint.url
        wait_until(lambda: refused(second_url), timeout=30, what="generation 2 stopped")
        time.sleep(1)
    timings["update"] = time.monotonic() - began
    assert loop.failures() == [], loop.failures()[:5]
    assert loop.labels() == {0, 1}  # the old model's answers, then the new one's
    assert ask(third_url + "/").json() == {"positive": 0.047426, "label": 0, "words": 2}
    assert fresh(endpoint).model_version == dislikes_good

    # The agent dies (kill -9): the endpoint serves on; the next agent follows it as it is.
    pid = generation_pid(endpoint, 3)
    agent.kill()
    assert ask(third_url + "/").status_code == 200
    agent = serving_agent(start_agent)
    wait_until(
        lambda: "following endpoint serve-cpu generation 3 again" in agent.output(),
        timeout=60,
        what="the new agent follows generation 3",
        agent=agent,
    )
    time.sleep(2)
    assert (fresh(endpoint).state, endpoint.url) == (EndpointState.READY, third_url)
    assert generation_pid(endpoint, 3) == pid
    assert ask(third_url + "/").status_code == 200

    # The agent stopped as a portal's restart stops it (SIGTERM): the same.
    assert agent.stop() == 0
    assert ask(third_url + "/").status_code == 200
    agent = serving_agent(start_agent)
    wait_until(
        lambda: "following endpoint serve-cpu generation 3 again" in agent.output(),
        timeout=60,
        what="the next agent follows generation 3",
        agent=agent,
    )
    assert generation_pid(endpoint, 3) == pid

    # It dies while no agent watches: the next agent starts it again, and it says so.
    agent.kill()
    processes.stop_group(pid, grace=5)
    assert refused(third_url)
    began = time.monotonic()
    agent = serving_agent(start_agent)
    wait_until(
        lambda: (
            "restarted by the agent after its process ended" in fresh(endpoint).state_reason
            and endpoint.state == EndpointState.READY
        ),
        timeout=START_SECONDS,
        what="generation 3 started again",
        agent=agent,
    )
    timings["restart"] = time.monotonic() - began
    restarted_url = endpoint.url
    assert restarted_url != third_url
    assert ask(restarted_url + "/").json()["label"] == 0

    # Its traffic, from Ray Serve's own metrics (the runner reads them every 5 s).
    client = world.api_client_for("researcher")
    with Requests(invoke, issued.plaintext) as loop:
        time.sleep(12)
    assert loop.failures() == []
    assert any(status == 200 for status, _ in loop.answers)

    def measured() -> dict[str, Any] | None:
        figures: dict[str, Any] = client.get(f"{API}/{endpoint.name}/metrics/").json()
        return figures if (figures.get("requests_per_second") or 0) > 0 else None

    figures = wait_until(measured, timeout=40, what="requests measured", agent=agent)
    assert figures["error_rate"] == 0
    assert 0 < figures["latency_p50_ms"] <= figures["latency_p95_ms"]
    assert figures["replicas_ready"] == figures["replicas_desired"] == 2
    log = client.get(f"{API}/{endpoint.name}/logs/", {"tail": 10000}).json()
    assert log["replica"] == "generation-3"
    assert "[serving] deploying app:app at /" in log["text"]
    assert log["replicas"][:3] == ["generation-3", "generation-2", "generation-1"]

    # A run that needs more than the machine has free beside the endpoint waits for it...
    run = submit(
        world,
        spec("after-the-endpoint", cpus="3"),
        {"main.py": "print('the machine is mine')\n"},
    )
    wait_until(
        lambda: "Waiting for 3 CPUs: 2 of this machine's 4 are free." in state_reason(run),
        timeout=30,
        what="the run waits for the endpoint's CPUs",
        agent=agent,
    )
    # ... until the endpoint stops: its port closes and its CPUs are the run's.
    began = time.monotonic()
    services.stop_endpoint(endpoint=endpoint, user=world.users["researcher"])
    deliver_all(endpoint)
    wait_until(lambda: refused(restarted_url), timeout=30, what="its port closed", agent=agent)
    timings["stop"] = time.monotonic() - began
    wait_for_state(run, RunState.SUCCEEDED, timeout=120, agent=agent)
    assert fresh(endpoint).state == EndpointState.STOPPED
    assert not process_record(EndpointFolder.of(endpoint.pk).generation(3)).exists()
    # Each generation's model, staged and checked, in the endpoint's history (a restart
    # reuses what its generation staged).
    staged = EndpointEvent.objects.for_workspace(world.alpha).filter(
        endpoint=endpoint, kind=EndpointEventKind.MODEL_STAGED
    )
    assert [(e.data["generation"], e.data["model"], e.data["files"]) for e in staged] == [
        (1, "reviews-classifier@1", 2),
        (2, "reviews-classifier@1", 2),
        (3, "reviews-classifier@2", 2),
    ]
    print("timings (s):", {name: round(seconds, 1) for name, seconds in timings.items()})


def state_reason(run: Any) -> str:
    run.refresh_from_db()
    return str(run.state_reason)


def test_an_import_path_that_does_not_exist_fails_with_ray_serves_message(
    world: Any, var_dir: Path, start_agent: Any, endpoints_left: None
) -> None:
    """No retry loop: Ray Serve's own message (its last line: the builder's exception), the
    generation stopped, the machine free again."""
    source = (
        (EXAMPLE / "tau.yaml")
        .read_text()
        .replace("import_path: app:app ", "import_path: app:nope ")
    )
    source = source.replace("  model: {name: reviews-classifier, version: latest}", "")
    assert "app:nope" in source
    endpoint = deploy(world, source.encode())
    agent = serving_agent(start_agent)
    wait_for(endpoint, agent, timeout=FIRST_INSTALL_SECONDS, state=EndpointState.FAILED)
    assert endpoint.state_reason == (
        "Ray Serve could not deploy the application: tau.serving.ServeConfigError: "
        "serve.import_path 'app:nope': app has no 'nope'"
    ), how_it_is(endpoint)
    layout = EndpointFolder.of(endpoint.pk).generation(1)
    wait_until(
        lambda: not process_record(layout).exists(),
        timeout=30,
        what="its processes stopped",
        agent=agent,
    )
    time.sleep(2)  # nothing starts it again
    assert fresh(endpoint).state == EndpointState.FAILED
    assert EndpointFolder.of(endpoint.pk).generations() == [1]
