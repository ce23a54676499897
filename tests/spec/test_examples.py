"""The article's tau.yaml and every example validate; a file with three mistakes gets three
precise problems."""

from __future__ import annotations

import ast
import json
import py_compile
from pathlib import Path

import pytest

from tau.spec import SpecError, load_spec, validate
from tau.spec.samples import ARTICLE_EXAMPLE, FULL_EXAMPLE

from .support import EXAMPLES, REPO


def test_the_article_example_validates_exactly_as_written() -> None:
    spec = load_spec(ARTICLE_EXAMPLE)

    assert spec.name == "aks-gpu-quickstart"
    assert spec.run.entrypoint == "train.py"
    assert spec.run.workload_kind == "rayjob"
    assert (spec.compute.gpus, spec.compute.workers) == (1, 1)
    assert (spec.compute.cpus, spec.compute.memory) == ("16", "64Gi")
    assert spec.runtime.image == "mcr.microsoft.com/aks/ai-runtime/ray:py3.12-ray2.56.0-cuda13.0"
    assert spec.runtime.pip == ("torch>=2.4.0",)


def test_the_gpu_quickstart_example_is_the_article_example_verbatim() -> None:
    text = (REPO / "examples" / "gpu-quickstart" / "tau.yaml").read_text("utf-8")
    assert text == ARTICLE_EXAMPLE


def test_the_examples_are_all_there() -> None:
    names = {path.parent.name for path in EXAMPLES}
    assert names >= {
        "cpu-quickstart",
        "gpu-quickstart",
        "multi-node-torchrun",
        "resume-from-checkpoint",
        "ddp",
        "fsdp",
        "deepspeed",
        "ray-tune",
        "lora",
        "qlora",
        "serve-cpu",
        "batch-inference",
        *LLM_EXAMPLES,
    }


#: The OpenAI-compatible LLM endpoints: each app.py starts its engine's own server in a Ray
#: Serve replica, with the same code for the replica after its engine's command.
LLM_EXAMPLES = ("vllm-serve", "sglang-serve", "trtllm-serve")
#: Where that shared code starts in each app.py.
LLM_SHARED_MARKER = "# --- The same in every LLM example from here on"
#: What an LLM app.py may import: the engines run as commands in the image, never in here
#: (neither this test suite nor the Ray head, which builds the application, has them).
LLM_APP_IMPORTS = {
    "__future__",
    "asyncio",
    "http.client",
    "os",
    "pathlib",
    "shlex",
    "signal",
    "socket",
    "subprocess",
    "sys",
    "tempfile",
    "time",
    "typing",
    "urllib.request",
    "ray",
    "aiohttp",  # Ray's (ray[default]), inside the replica
    "starlette.responses",  # Ray Serve's, inside the replica
}


def _example_id(path: Path) -> str:
    return path.parent.name if path.name == "tau.yaml" else f"{path.parent.name}-gpu"


@pytest.mark.parametrize("path", EXAMPLES, ids=_example_id)
def test_every_example_validates(path: Path) -> None:
    assert validate(path.read_bytes()) == []
    entrypoint_script = load_spec(path.read_bytes()).run.script
    if entrypoint_script is not None:
        assert (path.parent / entrypoint_script).is_file()


@pytest.mark.parametrize(
    "path", sorted((REPO / "examples").glob("*/*.py")), ids=lambda path: str(path.parent.name)
)
def test_every_example_program_compiles(path: Path, tmp_path: Path) -> None:
    py_compile.compile(str(path), cfile=str(tmp_path / "compiled.pyc"), doraise=True)


@pytest.mark.parametrize("example", ["resume-from-checkpoint", "train-on-data"])
def test_the_resume_and_data_examples_run_the_cpu_quickstart_program(example: str) -> None:
    # One program, three tau.yaml files; copies because bundles refuse links and `..`.
    quickstart = REPO / "examples" / "cpu-quickstart" / "train.py"
    copy = REPO / "examples" / example / "train.py"
    assert copy.read_bytes() == quickstart.read_bytes()


def test_the_multi_node_example_is_a_job_with_several_gpu_workers() -> None:
    spec = load_spec((REPO / "examples" / "multi-node-torchrun" / "tau.yaml").read_bytes())
    assert spec.run.workload_kind == "job"
    assert spec.compute.workers >= 2
    assert spec.compute.gpus >= 1
    assert spec.run.command()[:3] == ("torchrun", "--nproc-per-node", "8")


#: The GPU forms (tau.gpu.yaml beside the CPU tau.yaml): (workers, GPUs per worker).
GPU_FORMS = {"ddp": (2, 8), "fsdp": (2, 8), "lora": (1, 1), "ray-tune": (2, 1)}


def test_the_gpu_forms_are_all_there() -> None:
    found = {path.parent.name for path in (REPO / "examples").glob("*/tau.gpu.yaml")}
    assert found >= set(GPU_FORMS)


@pytest.mark.parametrize("name", sorted(GPU_FORMS))
def test_a_gpu_form_runs_its_example_s_program_on_gpus(name: str) -> None:
    """The same program, arguments, sweep and outputs as the CPU form; GPUs per worker, torchrun
    starting one process per GPU where a worker has several; and a program that picks CUDA
    (and NCCL, where workers train together) when it sees a GPU."""
    cpu = load_spec((REPO / "examples" / name / "tau.yaml").read_bytes())
    gpu = load_spec((REPO / "examples" / name / "tau.gpu.yaml").read_bytes())
    workers, gpus = GPU_FORMS[name]
    assert (gpu.compute.workers, gpu.compute.gpus) == (workers, gpus)
    assert gpu.run.workload_kind == cpu.run.workload_kind
    assert gpu.run.args == cpu.run.args
    assert gpu.execution == cpu.execution
    assert gpu.outputs == cpu.outputs
    assert gpu.name == f"{cpu.name}-gpu"
    command = gpu.run.command()
    if gpus > 1:
        assert command[:4] == ("torchrun", "--nproc-per-node", str(gpus), "train.py")
    else:
        assert command[:2] == ("python", "train.py") == cpu.run.command()[:2]
    program = (REPO / "examples" / name / "train.py").read_text("utf-8")
    assert "torch.cuda.is_available()" in program
    assert ('"nccl"' in program) == (workers > 1 and not gpu.execution.is_sweep)
    assert gpu.runtime.image is not None


def test_the_resume_example_retries_and_keeps_checkpoints() -> None:
    spec = load_spec((REPO / "examples" / "resume-from-checkpoint" / "tau.yaml").read_bytes())
    assert spec.resilience.max_retries >= 1
    assert "user_error" in spec.resilience.retry_on
    assert spec.resilience.checkpoint_dir == "checkpoints"
    assert "--fail-at-step" in spec.run.args


def test_the_examples_that_run_here_pin_what_make_test_downloads() -> None:
    """An example trained by the test suite on the local executor installs its
    ``runtime.pip`` from the wheels deploy/dev/example_wheels.py downloads: the pins of
    requirements/examples.txt, exactly (the GPU-only examples run only on a cluster). The
    CPU endpoint is served on the local executor the same way (its Ray Serve)."""
    lines = (REPO / "requirements" / "examples.txt").read_text("utf-8").splitlines()
    pinned = {line for line in lines if line and not line.startswith("#")}
    asked: set[str] = set()
    for name in (
        *("ddp", "fsdp", "deepspeed", "ray-train", "ray-tune", "lora", "serve-cpu"),
        "batch-inference",
    ):
        spec = load_spec((REPO / "examples" / name / "tau.yaml").read_bytes())
        assert set(spec.runtime.pip) <= pinned, name
        asked |= set(spec.runtime.pip)
    assert asked == pinned  # nothing downloaded for nothing
    assert all("==" in requirement for requirement in pinned)


@pytest.mark.parametrize("name", ["ddp", "fsdp", "deepspeed"])
def test_the_distributed_examples_are_jobs_of_two_cpu_workers_that_resume(name: str) -> None:
    spec = load_spec((REPO / "examples" / name / "tau.yaml").read_bytes())
    assert (spec.run.workload_kind, spec.compute.workers, spec.compute.gpus) == ("job", 2, 0)
    assert spec.resilience.checkpoint_dir == "checkpoints"
    assert "oom_killed" in spec.resilience.retry_on  # a worker killed by SIGKILL looks like it


def test_the_full_sample_uses_every_block() -> None:
    data = load_spec(FULL_EXAMPLE).to_dict()
    assert data["compute"]["gpu_type"] == "h100"
    assert data["runtime"]["secrets"]
    assert data["queue"] == {"priority": "high", "name": "research"}
    assert data["experiment"]["tags"] == ["baseline", "resnet50"]


THREE_MISTAKES = """\
schema_version: 1
name: vision-baseline
run:
  entrypoint: train.py
compute:
  gpus: two
  wokers: 2
  memory: 64Gi
runtime:
  env:
    TAU_RUN_ID: mine
"""


def test_a_file_with_three_mistakes_reports_all_three_with_lines_and_hints() -> None:
    with pytest.raises(SpecError) as raised:
        load_spec(THREE_MISTAKES, filename="tau.yaml")

    found = raised.value.errors
    assert [(p.path, p.line, p.column) for p in found] == [
        ("compute.gpus", 6, 9),
        ("compute.wokers", 7, 3),
        ("runtime.env.TAU_RUN_ID", 11, 5),
    ]
    gpus, workers, env = found
    assert gpus.message == "expected an integer, got the string `two`"
    assert workers.message == "unknown key `wokers`"
    assert workers.hint == "did you mean `workers`?"
    assert "reserved" in env.message
    assert env.hint is not None
    assert "TAU_" in env.hint
    assert str(raised.value).splitlines()[0] == "tau.yaml is not valid (3 problems)"
    assert "tau.yaml:7:3: compute.wokers: unknown key `wokers` (did you mean `workers`?)" in str(
        raised.value
    )


@pytest.mark.parametrize("name", LLM_EXAMPLES)
def test_an_llm_example_is_an_endpoint_on_one_gpu_that_imports_no_engine(name: str) -> None:
    folder = REPO / "examples" / name
    spec = load_spec((folder / "tau.yaml").read_bytes())
    assert spec.run.workload_kind == "rayservice"
    assert spec.serve is not None
    assert (spec.serve.import_path, spec.serve.route_prefix) == ("app:app", "/")
    assert (spec.serve.replicas, spec.compute.gpus) == (1, 1)
    assert spec.runtime.image is not None
    assert ":" in spec.runtime.image.rsplit("/", 1)[-1]  # a pinned tag
    assert not spec.runtime.pip  # the engine comes with the image, not at deploy time
    program = (folder / "app.py").read_text("utf-8")
    imported = set()
    for node in ast.walk(ast.parse(program)):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert imported <= LLM_APP_IMPORTS, imported - LLM_APP_IMPORTS
    # The request in the README names the model as the server is told to call it.
    request = json.loads((folder / "request.json").read_text("utf-8"))
    env = {variable.name: variable.value for variable in spec.runtime.env}
    served = env.get("SERVED_MODEL_NAME") or env["MODEL_ID"]
    assert request["model"] == served
    assert request["messages"][-1]["role"] == "user"
    readme = (folder / "README.md").read_text("utf-8")
    assert f"tau serve deploy --config examples/{name}/tau.yaml" in readme
    assert "/invoke/v1/chat/completions" in readme
    assert "endpoints:invoke" in readme
    assert "without a GPU" in readme


def test_the_llm_examples_share_the_replica_s_code() -> None:
    """A project ships as its own folder (no links, no ``..``): copies, kept identical."""
    shared = set()
    for name in LLM_EXAMPLES:
        program = (REPO / "examples" / name / "app.py").read_text("utf-8")
        assert LLM_SHARED_MARKER in program, name
        shared.add(program[program.index(LLM_SHARED_MARKER) :])
    assert len(shared) == 1
