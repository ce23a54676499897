"""Each rule of schema version 1, with the exact words a researcher reads."""

from __future__ import annotations

import json

import pytest

from tau.spec import MAX_NAME_LENGTH, RAYJOB_NAME_MAX_LENGTH, load_spec, validate

from .support import MINIMAL, only_problem, problems, spec

# ------------------------------------------------------------------ required keys, versions


def test_missing_required_keys_are_each_reported() -> None:
    found = problems("compute:\n  gpus: 1\n")
    assert [(p.path, p.message) for p in found] == [
        ("schema_version", "missing required key `schema_version`"),
        ("name", "missing required key `name`"),
        ("run", "missing required block `run`"),
    ]
    assert found[0].hint == "add `schema_version: 1`"


def test_a_missing_entrypoint_is_reported_at_the_run_block() -> None:
    problem = only_problem("schema_version: 1\nname: demo\nrun:\n  args: [x]\n")
    assert (problem.path, problem.line) == ("run.entrypoint", 4)
    assert problem.hint == "add `entrypoint: train.py`"


def test_another_schema_version_is_one_problem_not_one_per_new_key() -> None:
    problem = only_problem("schema_version: 2\nname: demo\nbrand_new_block: {}\n")
    assert problem.message == (
        "schema version 2 is not supported; this version of TauGrid reads schema version 1"
    )


def test_a_quoted_schema_version_gets_a_hint() -> None:
    problem = only_problem(MINIMAL.replace("schema_version: 1", 'schema_version: "1"'))
    assert problem.message == "expected the integer 1, got the string `1`"
    assert problem.hint == "remove the quotes: 1"


# ----------------------------------------------------------------------------- unknown keys


@pytest.mark.parametrize(
    ("block", "key", "hint"),
    [
        ("compute", "wokers", "did you mean `workers`?"),
        ("compute", "GPUs", "did you mean `gpus`?"),
        ("compute", "replicas", "did you mean `workers`?"),
        ("compute", "image", "`image` belongs in the `runtime` block"),
        ("runtime", "requirements", "did you mean `pip`?"),
        ("queue", "priority_class", "did you mean `priority`?"),
        ("resilience", "checkpoint", "did you mean `checkpoint_dir`?"),
        (
            "compute",
            "colour",
            "expected one of: `gpus`, `cpus`, `memory`, `workers`, `gpu_type`, `limits`, `head`",
        ),
    ],
)
def test_unknown_keys_get_a_close_match(block: str, key: str, hint: str) -> None:
    problem = only_problem(spec(f"{block}:\n  {key}: 1\n"))
    assert problem.path == f"{block}.{key}"
    assert problem.message == f"unknown key `{key}`"
    assert problem.hint == hint


def test_a_block_key_at_the_top_level_says_where_it_belongs() -> None:
    problem = only_problem(spec("gpus: 2\n"))
    assert problem.hint == "`gpus` belongs in the `compute` block"


def test_a_top_level_key_inside_a_block_says_so() -> None:
    problem = only_problem(spec(run="name: other\n"))
    assert problem.hint == "`name` is a top-level key; move it out of `run`"


@pytest.mark.parametrize("key", ["comptue", "resources"])
def test_unknown_top_level_keys_are_errors(key: str) -> None:
    problem = only_problem(spec(f"{key}: {{}}\n"))
    assert (problem.path, problem.hint) == (key, "did you mean `compute`?")


# ------------------------------------------------------------------------------ type errors


@pytest.mark.parametrize(
    ("extra", "path", "message", "hint"),
    [
        (
            "compute:\n  gpus: '2'\n",
            "compute.gpus",
            "expected an integer, got the string `2`",
            "remove the quotes: 2",
        ),
        (
            "compute:\n  gpus: 1.5\n",
            "compute.gpus",
            "expected an integer, got the number `1.5`",
            "write a whole number",
        ),
        ("compute:\n  gpus: [1]\n", "compute.gpus", "expected an integer, got a list", None),
        (
            "compute:\n  workers: true\n",
            "compute.workers",
            "expected an integer, got `true` (a boolean)",
            None,
        ),
        (
            "compute: 4\n",
            "compute",
            "expected a mapping, got the integer `4`",
            "put the keys of `compute` on the lines below it, indented",
        ),
        (
            "runtime:\n  pip: torch\n",
            "runtime.pip",
            "expected a list of strings, got the string `torch`",
            "write a list: [torch>=2.4.0], or one `- item` per line",
        ),
        (
            "queue:\n  priority: yes\n",
            "queue.priority",
            "expected a string, got `yes` (a boolean)",
            'YAML reads `yes` as a boolean; put it in quotes: "yes"',
        ),
        (
            "experiment:\n  tags: [a, [b]]\n",
            "experiment.tags[1]",
            "expected a string, got a list",
            None,
        ),
        (
            "runtime:\n  env: [A=1]\n",
            "runtime.env",
            "expected a mapping of variable names to values, got a list",
            "write one `NAME: value` per line, indented below `env:`",
        ),
    ],
)
def test_type_errors_say_what_was_expected(
    extra: str, path: str, message: str, hint: str | None
) -> None:
    problem = only_problem(spec(extra))
    assert (problem.path, problem.message, problem.hint) == (path, message, hint)


def test_null_for_a_field_with_a_default_is_an_error_with_the_default_named() -> None:
    problem = only_problem(spec("compute:\n  gpus:\n"))
    assert problem.message == "expected an integer, got nothing (null)"
    assert problem.hint == "give a value, or remove the key to use the default (0)"


def test_null_means_unset_or_empty_where_that_is_a_value() -> None:
    text = spec("runtime:\n  image:\n  pip:\nqueue:\nexperiment: ~\n", run="args:\n")
    loaded = load_spec(text)
    assert loaded.runtime.image is None
    assert loaded.runtime.pip == ()
    assert loaded.queue.priority is None
    assert loaded.run.args == ()


def test_integers_must_be_plain_decimal() -> None:
    problem = only_problem(spec("compute:\n  gpus: 010\n"))
    assert problem.message == "write integers in plain decimal digits, not `010`"
    assert problem.hint is not None
    assert "this one means 8" in problem.hint


# ---------------------------------------------------------------------------------- names


def test_name_must_be_a_dns1035_label_with_a_suggestion() -> None:
    problem = only_problem(MINIMAL.replace("name: demo", "name: My_Run"))
    assert problem.path == "name"
    assert problem.message.startswith("`My_Run` is not a valid name: it must be lower-case")
    assert problem.hint == "try `my-run`"


def test_name_must_start_with_a_letter() -> None:
    problem = only_problem(MINIMAL.replace("name: demo", "name: 1st-run"))
    assert problem.hint == "try `run-1st-run`"


def test_names_leave_room_for_the_run_suffix_in_a_47_character_rayjob_name() -> None:
    assert MAX_NAME_LENGTH == 38 == RAYJOB_NAME_MAX_LENGTH - 1 - 8
    longest = "a" * MAX_NAME_LENGTH
    assert validate(MINIMAL.replace("name: demo", f"name: {longest}")) == []

    problem = only_problem(MINIMAL.replace("name: demo", f"name: {longest}b"))
    assert problem.message == "is 39 characters long; at most 38 are allowed"
    assert problem.hint is not None
    assert "47" in problem.hint
    assert "RayJob" in problem.hint


# -------------------------------------------------------------------------------- run block


def test_entrypoint_scripts_and_commands() -> None:
    assert load_spec(spec()).run.command() == ("python", "train.py")
    text = MINIMAL.replace("train.py", "./src/train.py") + "  args: [--epochs, 10, --lr, 1.10]\n"
    run = load_spec(text).run
    assert run.entrypoint == "src/train.py"
    assert run.script == "src/train.py"
    assert run.command() == ("python", "src/train.py", "--epochs", "10", "--lr", "1.10")

    run = load_spec(MINIMAL.replace("train.py", "torchrun --nproc-per-node 8 train.py")).run
    assert run.script is None
    assert run.command() == ("torchrun", "--nproc-per-node", "8", "train.py")

    run = load_spec(MINIMAL.replace("train.py", "run.sh --fast")).run
    assert run.command() == ("bash", "run.sh", "--fast")


@pytest.mark.parametrize(
    ("entrypoint", "message"),
    [
        ("../train.py", "the script `../train.py` uses `..`; it must stay inside its directory"),
        ("/opt/train.py", "the script `/opt/train.py` is absolute; it must be relative"),
        ("python -c 'oops", "`python -c 'oops` has a quote that is never closed"),
        ('""', "must not be empty"),
    ],
)
def test_entrypoint_problems(entrypoint: str, message: str) -> None:
    problem = only_problem(MINIMAL.replace("train.py", entrypoint))
    assert (problem.path, problem.message) == ("run.entrypoint", message)


def test_workload_kind_is_rayjob_job_or_rayservice() -> None:
    problem = only_problem(spec(run="workload_kind: rayjobs\n"))
    assert problem.message == (
        "`rayjobs` is not allowed here; expected one of: `rayjob`, `job`, `rayservice`"
    )
    assert problem.hint == "did you mean `rayjob`?"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("project_dir", "../other", "the project directory `../other` uses `..`"),
        ("project_dir", "/home/me/project", "the project directory `/home/me/project` is absolute"),
        ("project_dir", "'C:\\work'", "the project directory `C:\\work` uses `\\`"),
        ("project_dir", "~/work", "the project directory `~/work` starts with `~`"),
        ("exclude", "[data/../..]", "the pattern `data/../..` uses `..`"),
    ],
)
def test_paths_cannot_escape_the_project_directory(field: str, value: str, message: str) -> None:
    problem = only_problem(spec(run=f"{field}: {value}\n"))
    assert problem.message.startswith(message)


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        ("resilience:\n  checkpoint_dir: ../ckpt\n", "resilience.checkpoint_dir"),
        ("outputs:\n  metrics_file: /tmp/metrics.jsonl\n", "outputs.metrics_file"),
        ("outputs:\n  artifacts: ['../../etc/*']\n", "outputs.artifacts[0]"),
    ],
)
def test_output_paths_cannot_escape_either(extra: str, path: str) -> None:
    assert only_problem(spec(extra)).path == path


def test_the_metrics_file_must_be_a_file() -> None:
    problem = only_problem(spec("outputs:\n  metrics_file: logs/\n"))
    assert problem.message == "`logs/` is a directory; name the file the metrics rows go to"


@pytest.mark.parametrize(
    ("written", "seconds"),
    [
        ("2h", 7200),
        ("90m", 5400),
        ("3600s", 3600),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("1d", 86400),
        (600, 600),
        ("'600'", 600),
    ],
)
def test_max_runtime_durations(written: str | int, seconds: int) -> None:
    assert load_spec(spec(run=f"max_runtime: {written}\n")).run.max_runtime == seconds


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("2 hours", "`2 hours` is not a duration"),
        ("1:30", "write integers in plain decimal digits, not `1:30`"),
        ("1.5h", "`1.5h` is not a duration"),
        ("0", "must be between 1s and 30d (got 0s)"),
        ("31d", "must be between 1s and 30d (got 31d)"),
    ],
)
def test_max_runtime_is_bounded(written: str, message: str) -> None:
    problem = only_problem(spec(run=f"max_runtime: {written}\n"))
    assert (problem.path, problem.message) == ("run.max_runtime", message)


# ---------------------------------------------------------------------------- compute block


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("gpus: -1", "must be between 0 and 16 (got -1)"),
        ("gpus: 17", "must be between 0 and 16 (got 17)"),
        ("workers: 0", "must be between 1 and 1024 (got 0)"),
        ("cpus: 0", "must be between 1m and 1024 (got 0)"),
        ("cpus: 2000", "must be between 1m and 1024 (got 2000)"),
        ("memory: 64", "must be between 1Mi and 16Ti (got 64)"),
        ("memory: 32Ti", "must be between 1Mi and 16Ti (got 32Ti)"),
        ("cpus: 16 cores", "`16 cores` is not a Kubernetes quantity"),
        ("memory: 64GB", "`64GB` is not a Kubernetes quantity"),
        (
            "cpus: 1.0005",
            "`1.0005` is finer than Kubernetes can request; CPU is counted in "
            "millicores (1m = 0.001 cores)",
        ),
        ("memory: 1.5", "must be between 1Mi and 16Ti (got 1.5)"),
        ("memory: 1.1Mi", "`1.1Mi` is not a whole number of bytes"),
    ],
)
def test_compute_bounds(extra: str, message: str) -> None:
    problem = only_problem(spec(f"compute:\n  {extra}\n"))
    assert problem.message == message


def test_memory_hints_name_the_suffix_people_meant() -> None:
    assert only_problem(spec("compute:\n  memory: 64GB\n")).hint == (
        "suffixes are case-sensitive and have no B: did you mean 64Gi? "
        "64G would mean powers of 1000"
    )
    assert only_problem(spec("compute:\n  memory: 64\n")).hint == (
        "a number without a suffix is bytes; did you mean 64Gi or 64Mi?"
    )


def test_too_many_gpus_per_worker_suggests_more_workers() -> None:
    problem = only_problem(spec("compute:\n  gpus: 64\n"))
    assert problem.hint == "that is per worker; ask for more `workers` instead"


def test_gpu_type_needs_gpus() -> None:
    problem = only_problem(spec("compute:\n  gpu_type: h100\n"))
    assert (problem.path, problem.message) == (
        "compute.gpu_type",
        "`gpu_type` is set but `gpus` is 0",
    )


def test_gpu_type_is_a_flavor_name() -> None:
    problem = only_problem(spec("compute:\n  gpus: 1\n  gpu_type: H100_80GB\n"))
    assert problem.message.startswith("`H100_80GB` is not a valid GPU type")


# ---------------------------------------------------------------------------- runtime block


@pytest.mark.parametrize(
    "image",
    [
        "python:3.12-slim",
        "ubuntu",
        "localhost:5000/team/trainer:v1",
        "ghcr.io/org/repo/image@sha256:" + "a" * 64,
        "mcr.microsoft.com/aks/ai-runtime/ray:py3.12-ray2.56.0-cuda13.0",
    ],
)
def test_image_references_are_accepted(image: str) -> None:
    assert load_spec(spec(f"runtime:\n  image: {image}\n")).runtime.image == image


def test_image_references_are_checked() -> None:
    problem = only_problem(spec("runtime:\n  image: Ubuntu:22.04\n"))
    assert problem.message == "`Ubuntu:22.04` is not a container image reference"
    assert problem.hint == "image names are lower-case: `ubuntu:22.04`"


@pytest.mark.parametrize(
    "requirement",
    [
        "torch",
        "torch>=2.4.0",
        "torch >= 2.4, < 3",
        "transformers[torch,sentencepiece]==4.46.*",
        "numpy<2; python_version < '3.13'",
        "mypkg @ https://example.org/mypkg-1.0-py3-none-any.whl",
        "flash-attn~=2.6",
    ],
)
def test_pip_requirements_are_accepted(requirement: str) -> None:
    text = spec(f"runtime:\n  pip:\n    - {json.dumps(requirement)}\n")
    assert load_spec(text).runtime.pip == (requirement,)


@pytest.mark.parametrize(
    ("requirement", "hint"),
    [
        (
            "-r requirements.txt",
            "pip options such as -r and --index-url are not supported; list requirements",
        ),
        ("torch=2.4", "pin a version with `==`: torch==2.4"),
        ("https://example.org/x.whl", "write a direct reference as `name @ url`"),
        ("torch>=2.4\n--index-url http://evil", None),
    ],
)
def test_pip_requirements_are_shape_checked(requirement: str, hint: str | None) -> None:
    problem = only_problem(spec(f"runtime:\n  pip:\n    - {json.dumps(requirement)}\n"))
    assert problem.path == "runtime.pip[0]"
    if hint is not None:
        assert problem.hint == hint


def test_pip_requirements_are_bounded_and_unique() -> None:
    many = "".join(f"    - pkg{index}\n" for index in range(129))
    assert only_problem(spec("runtime:\n  pip:\n" + many)).message == (
        "has 129 items; at most 128 are allowed"
    )
    problem = only_problem(spec("runtime:\n  pip: [torch, torch]\n"))
    assert problem.message == "`torch` is listed twice (also item 1 of the list)"


def test_env_values_are_literal_strings_taken_as_written() -> None:
    text = spec("runtime:\n  env:\n    PORT: 8080\n    RATIO: 1.10\n    DEBUG: yes\n    A: ''\n")
    assert load_spec(text).runtime.env_dict() == {
        "A": "",
        "DEBUG": "yes",
        "PORT": "8080",
        "RATIO": "1.10",
    }


@pytest.mark.parametrize("name", ["TAU_RUN_ID", "TAU_ANYTHING", "tau_lower"])
def test_tau_env_names_are_reserved(name: str) -> None:
    problem = only_problem(spec(f"runtime:\n  env:\n    {name}: x\n"))
    assert problem.path == f"runtime.env.{name}"
    assert problem.message == (
        f"`{name}` is reserved: names starting with TAU_ are set by the platform"
    )


def test_env_names_must_be_valid() -> None:
    problem = only_problem(spec("runtime:\n  env:\n    MY-VAR: x\n"))
    assert problem.path == "runtime.env.MY-VAR"
    assert problem.hint == "try `MY_VAR`"


def test_env_is_bounded_in_total() -> None:
    big = "x" * 30_000
    text = spec("runtime:\n  env:\n" + "".join(f"    V{i}: {big}\n" for i in range(3)))
    problem = only_problem(text)
    assert (
        problem.message == "holds 90006 characters of names and values; at most 65536 are allowed"
    )


def test_env_values_cannot_hold_nul() -> None:
    problem = only_problem(spec('runtime:\n  env:\n    A: "x\\0y"\n'))
    assert problem.message == "contains a control character (U+0000)"


def test_secrets_are_references_by_env_secret_and_key() -> None:
    text = spec(
        "runtime:\n  secrets:\n"
        "    - {env: WANDB_API_KEY, secret: wandb, key: api-key}\n"
        "    - {env: HF_TOKEN, secret: hf, key: token}\n"
    )
    secrets = load_spec(text).runtime.secrets
    assert [(s.env, s.secret, s.key) for s in secrets] == [
        ("HF_TOKEN", "hf", "token"),
        ("WANDB_API_KEY", "wandb", "api-key"),
    ]


def test_secret_references_are_checked() -> None:
    text = spec(
        "runtime:\n  env: {TOKEN: x}\n  secrets:\n"
        "    - {name: A, secret: s, key: k}\n"
        "    - {env: TAU_TOKEN, secret: Bad_Name, key: 'a/b'}\n"
        "    - {env: TOKEN, secret: s, key: k}\n"
        "    - {env: TWICE, secret: s, key: k}\n"
        "    - {env: TWICE, secret: t, key: k}\n"
    )
    found = [(p.path, p.message) for p in problems(text)]
    assert found == [
        ("runtime.secrets[0].env", "missing required key `env`"),
        ("runtime.secrets[0].name", "unknown key `name`"),
        (
            "runtime.secrets[1].env",
            "`TAU_TOKEN` is reserved: names starting with TAU_ are set by the platform",
        ),
        (
            "runtime.secrets[1].secret",
            "`Bad_Name` is not a valid Secret name: it must be lower-case letters, digits, "
            "'-' and '.', starting and ending with a letter or digit",
        ),
        (
            "runtime.secrets[1].key",
            "`a/b` is not a valid Secret key: use letters, digits, `-`, `_` and `.`",
        ),
        ("runtime.secrets[2].env", "`TOKEN` is also set in `runtime.env`"),
        ("runtime.secrets[4]", "`TWICE` is listed twice (also item 4 of the list)"),
    ]


# ----------------------------------------------------------------- queue, resilience, …


def test_queue_names_are_kubernetes_names() -> None:
    assert load_spec(spec("queue:\n  priority: high\n  name: research\n")).queue.name == "research"
    problem = only_problem(spec("queue:\n  priority: High Priority\n"))
    assert problem.message.startswith("`High Priority` is not a valid priority class name")


def test_retry_on_accepts_failure_classes_and_defaults_to_infrastructure_failures() -> None:
    assert load_spec(spec()).resilience.retry_on == (
        "preempted",
        "evicted",
        "node_failure",
        "infrastructure",
    )
    problem = only_problem(spec("resilience:\n  retry_on: [preempted, oom]\n"))
    assert problem.path == "resilience.retry_on[1]"
    assert problem.hint == "did you mean `oom_killed`?"


def test_retries_and_backoff_are_bounded() -> None:
    assert only_problem(spec("resilience:\n  max_retries: 21\n")).message == (
        "must be between 0 and 20 (got 21)"
    )
    problem = only_problem(spec("resilience:\n  backoff: {initial: 1h, max: 10m}\n"))
    assert (problem.path, problem.message) == (
        "resilience.backoff.initial",
        "`initial` is longer than `max`",
    )


def test_experiment_tags_are_bounded_labels() -> None:
    tags = ", ".join(f"t{index}" for index in range(33))
    assert only_problem(spec(f"experiment:\n  tags: [{tags}]\n")).message == (
        "has 33 items; at most 32 are allowed"
    )
    problem = only_problem(spec("experiment:\n  tags: ['has space']\n"))
    assert problem.message.startswith("`has space` is not a valid tag")
    too_long = "p" * 101
    assert only_problem(spec(f"experiment:\n  project: {too_long}\n")).message == (
        "is 101 characters long; at most 100 are allowed"
    )


def test_one_line_strings_refuse_line_breaks() -> None:
    problem = only_problem(spec('experiment:\n  project: "a\\nb"\n'))
    assert problem.message == "contains a line break or control character (U+000A)"
