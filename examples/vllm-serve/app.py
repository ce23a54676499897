"""An OpenAI-compatible LLM endpoint on one GPU per replica: vLLM's own OpenAI server
(``vllm serve``) inside a Ray Serve replica.

Each replica holds the GPU Ray gave it (``CUDA_VISIBLE_DEVICES``, set by Ray), starts vLLM's
server on loopback with that GPU, waits until it answers ``/health``, and forwards
``/v1/chat/completions``, ``/v1/completions``, ``/v1/models`` (and the rest of ``/v1/``) to
it, streamed answers (``"stream": true``) as they come; a ``POST /`` is a chat request.
Ray Serve's health check asks the server too, so a replica whose server died is replaced.

Why not Ray Serve LLM (``ray.serve.llm.build_openai_app``): its application is a CPU router
(the ingress) in front of an engine deployment with a placement group of its own, while
TauGrid gives ``compute`` (here 1 GPU, 8 CPUs: one Ray worker pod) to the application's
ingress deployment. The router would take the pod's GPU and the engine would wait for
another one forever. One deployment that is both the ingress and the engine fits a replica
= one pod = one GPU.

What it serves: ``$TAU_MODEL_DIR`` (``serve.model``, a Hugging Face format checkpoint staged
read-only) when there is one, else ``$MODEL_ID`` (a Hugging Face Hub id); clients name it
``$SERVED_MODEL_NAME``. ``$MAX_MODEL_LEN`` caps the context; ``$ENGINE_ARGS`` adds flags of
``vllm serve``.

Imports only the standard library and Ray Serve (aiohttp and Starlette come with it), so it
loads anywhere Ray does; vLLM itself runs only in the image, as a command.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from http.client import HTTPException
from pathlib import Path
from typing import Any

from ray import serve

#: How long a replica waits for the engine to answer (seconds): a download of the weights
#: from the Hub and their load onto the GPU come first.
START_TIMEOUT_S = float(os.environ.get("ENGINE_START_TIMEOUT_S", "1800"))
#: How long the engine gets to stop on SIGTERM before it is killed (seconds).
STOP_TIMEOUT_S = 30.0
#: The paths forwarded to the engine: its OpenAI API and its own health check.
FORWARDED = ("/v1/", "/health")
#: Where a POST to the application's root goes: the chat API.
CHAT = "/v1/chat/completions"
#: Request headers the engine reads.
REQUEST_HEADERS = ("content-type", "accept")


def model_source() -> str:
    """The staged workspace model when the endpoint has one, else the Hub id."""
    staged = os.environ.get("TAU_MODEL_DIR")
    if staged:
        return staged
    hub_id = os.environ.get("MODEL_ID")
    if not hub_id:
        raise RuntimeError("no model: set serve.model in tau.yaml or MODEL_ID in runtime.env")
    return hub_id


def served_model_name() -> str:
    return os.environ.get("SERVED_MODEL_NAME") or os.environ.get("TAU_ENDPOINT") or "model"


def engine_command(port: int) -> list[str]:
    """vLLM's OpenAI server on loopback: only this replica talks to it."""
    command = [
        "vllm",
        "serve",
        model_source(),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        served_model_name(),
        "--max-model-len",
        os.environ.get("MAX_MODEL_LEN", "8192"),
    ]
    return command + shlex.split(os.environ.get("ENGINE_ARGS", ""))


# --- The same in every LLM example from here on (vllm-serve, sglang-serve, trtllm-serve) ----


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            return bool(response.status == 200)
    except (OSError, HTTPException):  # not yet listening, or 503 while it loads
        return False


def engine_pid_file() -> Path:
    """Where a replica notes its engine, per GPU: a replica that died without stopping it
    (its process killed) leaves it holding the GPU's memory, and the next replica given
    that GPU on this node stops it first."""
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "none").replace(",", "-")
    return Path(tempfile.gettempdir()) / f"taugrid-engine-gpu-{gpus}.pid"


def stop_leftover_engine() -> None:
    try:
        pid = int(engine_pid_file().read_text())
        os.killpg(pid, signal.SIGKILL)  # its own session: the group is the engine's alone
        print(f"stopped the engine an earlier replica left behind (pid {pid})", flush=True)
        time.sleep(5)  # the GPU's memory is freed once its processes are gone
    except (OSError, ValueError):
        pass  # none, or gone already


@serve.deployment(
    # Continuous batching wants many requests at once in one engine.
    max_ongoing_requests=64,
    health_check_period_s=10,
    health_check_timeout_s=30,
    graceful_shutdown_timeout_s=60,
)
class OpenAIServer:
    """The engine's OpenAI server, started and watched by this replica, and a proxy to it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        command = engine_command(self.port)
        stop_leftover_engine()
        print(f"starting: {shlex.join(command)}", flush=True)
        # A session of its own: the stop reaches the engine's worker processes too. Its
        # output goes to this replica's log.
        self.process = subprocess.Popen(command, start_new_session=True)  # noqa: S603
        engine_pid_file().write_text(str(self.process.pid))
        self.session: Any = None
        deadline = time.monotonic() + START_TIMEOUT_S
        while not answers(f"{self.base}/health"):
            code = self.process.poll()
            if code is not None:
                self._stop()
                raise RuntimeError(
                    f"the engine exited with {code} before it answered: its own lines above "
                    "in this replica's log say why"
                )
            if time.monotonic() > deadline:
                self._stop()
                raise RuntimeError(f"the engine did not answer within {START_TIMEOUT_S:.0f} s")
            time.sleep(2)
        print(f"the engine answers on {self.base}", flush=True)

    async def _client(self) -> Any:
        if self.session is None:
            import aiohttp

            # No total timeout: a long answer streams for as long as it takes.
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
            self.session = aiohttp.ClientSession(timeout=timeout)
        return self.session

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import JSONResponse, Response, StreamingResponse

        path = request.url.path
        root = request.scope.get("root_path") or ""
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        if path == "/" and request.method == "POST":
            path = CHAT  # `tau serve invoke NAME --data @request.json`, without --path
        if not path.startswith(FORWARDED):
            return JSONResponse({"error": f"no route {path}: use /v1/..."}, status_code=404)
        import aiohttp

        session = await self._client()
        headers = {key: request.headers[key] for key in REQUEST_HEADERS if key in request.headers}
        try:
            upstream = await session.request(
                request.method,
                f"{self.base}{path}",
                params=list(request.query_params.multi_items()),
                data=await request.body(),
                headers=headers,
            )
        except aiohttp.ClientError as error:
            return JSONResponse({"error": f"the engine does not answer: {error}"}, status_code=502)
        media_type = upstream.headers.get("content-type", "application/json")
        if media_type.startswith("text/event-stream"):

            async def chunks() -> Any:
                try:
                    async for chunk in upstream.content.iter_any():
                        yield chunk
                finally:
                    upstream.release()

            return StreamingResponse(chunks(), status_code=upstream.status, media_type=media_type)
        try:
            body = await upstream.read()
        finally:
            upstream.release()
        return Response(body, status_code=upstream.status, media_type=media_type)

    async def check_health(self) -> None:
        """Ray Serve's health check: the engine runs and answers (else a new replica)."""
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(f"the engine exited with {code}")
        if not await asyncio.to_thread(answers, f"{self.base}/health"):
            raise RuntimeError("the engine's /health does not answer 200")

    def _stop(self) -> None:
        process = getattr(self, "process", None)
        for signum, seconds in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 5.0)):
            if process is None or process.poll() is not None:
                break
            try:
                os.killpg(process.pid, signum)
                process.wait(seconds)
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        if process is not None:
            engine_pid_file().unlink(missing_ok=True)

    def __del__(self) -> None:
        # Ray Serve calls it when the replica stops (a scale down, an update, a stop).
        self._stop()


app = OpenAIServer.bind()
