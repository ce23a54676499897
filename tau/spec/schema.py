"""Schema version 1 of tau.yaml: every block, field, default and bound, in one table.

The same definitions check a file, normalise it into a ``Spec`` and export the JSON Schema;
``docs/tau-yaml.md`` documents them for people (a test keeps the two in step). Bounds are
deliberately generous but finite: they exist so that no spec can ask the server for
unbounded work, not to second-guess a workspace's policy, which is checked at submission.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from tau.k8s_names import (
    dns1035_label_problem,
    dns1123_label_problem,
    dns1123_subdomain_problem,
    label_value_problem,
)
from tau.spec.fields import (
    INVALID,
    BlockValues,
    DurationKind,
    EnumKind,
    Field,
    IntegerKind,
    Invalid,
    JsonSchema,
    Kind,
    ListKind,
    ObjectKind,
    QuantityKind,
    StringKind,
    describe,
    is_null,
    normalise_relative_path,
    path_kind,
    relative_path_problem,
)
from tau.spec.loader import load_yaml
from tau.spec.model import (
    DEFAULT_RETRY_ON,
    FAILURE_CLASSES,
    SCHEMA_VERSION,
    WORKLOAD_KINDS,
    Backoff,
    Compute,
    EnvVar,
    Experiment,
    Outputs,
    Queue,
    Resilience,
    Run,
    Runtime,
    SecretRef,
    Spec,
    script_interpreter,
)
from tau.spec.nodes import MappingNode, Node, NotJsonLike, ScalarNode, SequenceNode, from_python
from tau.spec.problems import (
    DOCUMENT_PATH,
    ProblemCollector,
    SpecError,
    SpecProblem,
    index_path,
    join_path,
    quote,
)

#: KubeRay refuses RayJob names longer than this.
RAYJOB_NAME_MAX_LENGTH = 47
#: Run names are ``<spec name>-<suffix>``; the server's suffix has at most this many characters.
RUN_NAME_SUFFIX_MAX_LENGTH = 8
#: So the longest run name still fits a RayJob name: 47 - 1 - 8 = 38.
MAX_NAME_LENGTH = RAYJOB_NAME_MAX_LENGTH - 1 - RUN_NAME_SUFFIX_MAX_LENGTH

MAX_GPUS_PER_WORKER = 16
MAX_WORKERS = 1024
MAX_RETRIES = 20
MAX_RUNTIME_SECONDS = 30 * 86400
MAX_ENV_VARS = 128
MAX_ENV_VALUE_LENGTH = 32 * 1024
#: Names plus values of all ``runtime.env`` entries; well under Kubernetes' object size limit.
MAX_ENV_TOTAL_LENGTH = 64 * 1024
RESERVED_ENV_PREFIX = "TAU_"

# ---------------------------------------------------------------------------- value rules


def _name_hint(text: str) -> str | None:
    suggestion = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if suggestion and not suggestion[0].isalpha():
        suggestion = "run-" + suggestion
    suggestion = suggestion[:MAX_NAME_LENGTH].rstrip("-")
    if suggestion and suggestion != text and dns1035_label_problem(suggestion) is None:
        return f"try `{suggestion}`"
    return "use lower-case letters, digits and `-`, starting with a letter, e.g. `my-run`"


def _name_problem(text: str) -> str | None:
    problem = dns1035_label_problem(text, max_length=MAX_NAME_LENGTH)
    return f"{quote(text)} is not a valid name: it {problem}" if problem else None


def _entrypoint_problem(text: str) -> str | None:
    try:
        words = shlex.split(text)
    except ValueError:
        return f"{quote(text)} has a quote that is never closed"
    if not words:
        return "must not be empty"
    if script_interpreter(words[0]):
        return relative_path_problem(words[0], what="script")
    return None


def _normalise_entrypoint(text: str) -> str:
    words = shlex.split(text)
    if len(words) == 1 and script_interpreter(words[0]) and text == words[0]:
        return normalise_relative_path(text)
    return text


_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
# The image reference grammar of the distribution project (Docker, containerd, Kubernetes),
# without IPv6 registry hosts.
_IMAGE_PATTERN = (
    rf"^(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?/)?"
    rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
_IMAGE = re.compile(_IMAGE_PATTERN)


def _image_problem(text: str) -> str | None:
    if _IMAGE.fullmatch(text):
        return None
    return f"{quote(text)} is not a container image reference"


def _image_hint(text: str) -> str:
    if text != text.lower() and _IMAGE.fullmatch(text.lower()):
        return f"image names are lower-case: `{text.lower()}`"
    return "write registry/path:tag, e.g. `python:3.12-slim` or `ghcr.io/team/trainer:1.4`"


_REQUIREMENT_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_VERSION_CLAUSE = r"(?:===|~=|==|!=|<=|>=|<|>)\s*[A-Za-z0-9_.*+!-]+"
_VERSIONS = rf"{_VERSION_CLAUSE}(?:\s*,\s*{_VERSION_CLAUSE})*"
# A PEP 508 requirement: name, extras, then versions or a direct URL, then a marker.
_REQUIREMENT = re.compile(
    rf"{_REQUIREMENT_NAME}\s*"
    rf"(?:\[\s*(?:{_REQUIREMENT_NAME}(?:\s*,\s*{_REQUIREMENT_NAME})*)?\s*\])?\s*"
    rf"(?:(?:{_VERSIONS}|\(\s*{_VERSIONS}\s*\))?\s*(?:;\s*\S.*)?"
    r"|@\s*\S+(?:\s+;\s*\S.*)?)",
    re.ASCII,
)


def _requirement_problem(text: str) -> str | None:
    if _REQUIREMENT.fullmatch(text):
        return None
    return f"{quote(text)} is not a pip requirement"


def _requirement_hint(text: str) -> str:
    if text.startswith("-"):
        return "pip options such as -r and --index-url are not supported; list requirements"
    if re.fullmatch(rf"{_REQUIREMENT_NAME}\s*=\s*\S+", text, re.ASCII):
        name, _, version = text.partition("=")
        return f"pin a version with `==`: {name.strip()}=={version.strip()}"
    if "://" in text:
        return "write a direct reference as `name @ url`"
    return "write a requirement such as torch, torch>=2.4.0 or numpy==2.1.*"


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a workload's environment variable (None when it can)."""
    if not _ENV_NAME.fullmatch(name):
        return (
            f"{quote(name)} is not a valid environment variable name: use letters, digits "
            "and `_`, not starting with a digit"
        )
    if name.upper().startswith(RESERVED_ENV_PREFIX):
        return f"{quote(name)} is reserved: names starting with TAU_ are set by the platform"
    return None


def _env_name_hint(name: str) -> str:
    if name.upper().startswith(RESERVED_ENV_PREFIX):
        return "choose another name; the platform sets TAU_RUN_ID, TAU_OUTPUT_DIR and the rest"
    suggestion = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if suggestion and suggestion[0].isdigit():
        suggestion = "_" + suggestion
    return f"try `{suggestion}`" if suggestion else "e.g. `WANDB_PROJECT`"


def _priority_problem(text: str) -> str | None:
    # Also a label value (kueue.x-k8s.io/priority-class), hence the field's 63-character limit.
    problem = dns1123_subdomain_problem(text)
    return f"{quote(text)} is not a valid priority class name: it {problem}" if problem else None


def _label_problem(what: str) -> Callable[[str], str | None]:
    def problem(text: str) -> str | None:
        reason = dns1123_label_problem(text)
        return f"{quote(text)} is not a valid {what}: it {reason}" if reason else None

    return problem


def _secret_name_problem(text: str) -> str | None:
    reason = dns1123_subdomain_problem(text)
    return f"{quote(text)} is not a valid Secret name: it {reason}" if reason else None


_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def _secret_key_problem(text: str) -> str | None:
    if _SECRET_KEY.fullmatch(text):
        return None
    return f"{quote(text)} is not a valid Secret key: use letters, digits, `-`, `_` and `.`"


def _tag_problem(text: str) -> str | None:
    reason = label_value_problem(text)
    return f"{quote(text)} is not a valid tag: it {reason}" if reason else None


def _label_text_problem(text: str) -> str | None:
    if text != text.strip():
        return f"{quote(text)} starts or ends with spaces"
    return None


def _metrics_file_problem(text: str) -> str | None:
    problem = relative_path_problem(text, what="metrics file")
    if problem:
        return problem
    if text.endswith("/") or normalise_relative_path(text) == ".":
        return f"{quote(text)} is a directory; name the file the metrics rows go to"
    return None


# ----------------------------------------------------------------------------- the blocks


class SchemaVersionKind(Kind[int]):
    expected = "the integer 1"

    def check_node(self, node: Node, path: str, problems: ProblemCollector) -> int | Invalid:
        if isinstance(node, ScalarNode) and node.kind == "str" and node.text.strip() == "1":
            return self.type_problem(node, path, problems, "remove the quotes: 1")
        if not isinstance(node, ScalarNode) or node.kind != "int":
            return self.type_problem(node, path, problems, "write `schema_version: 1`")
        if node.value != SCHEMA_VERSION:
            problems.add(
                path,
                node,
                f"schema version {node.text} is not supported; "
                f"this version of TauGrid reads schema version {SCHEMA_VERSION}",
                "upgrade TauGrid, or write the spec for schema version 1",
            )
            return INVALID
        return SCHEMA_VERSION

    def json_schema(self) -> JsonSchema:
        return {"const": SCHEMA_VERSION}


class EnvKind(Kind[tuple[EnvVar, ...]]):
    """``NAME: value`` pairs; values are taken as written (``PORT: 8080`` is "8080")."""

    null_is_empty = True
    expected = "a mapping of variable names to values"

    def __init__(self) -> None:
        self.value_kind = StringKind(
            max_length=MAX_ENV_VALUE_LENGTH,
            min_length=0,
            verbatim=True,
            multiline=True,
            expected="a value (text, a number or a boolean)",
        )

    def check_node(
        self, node: Node, path: str, problems: ProblemCollector
    ) -> tuple[EnvVar, ...] | Invalid:
        if not isinstance(node, MappingNode):
            hint = "write one `NAME: value` per line, indented below `env:`"
            return self.type_problem(node, path, problems, hint)
        if len(node.entries) > MAX_ENV_VARS:
            problems.add(
                path,
                node,
                f"has {len(node.entries)} variables; at most {MAX_ENV_VARS} are allowed",
                "keep configuration in a file in the project directory",
            )
            return INVALID
        variables: list[EnvVar] = []
        failed = False
        for key, value_node in node.entries:
            variable_path = join_path(path, key.text)
            problem = env_name_problem(key.text)
            if problem:
                problems.add(variable_path, key, problem, _env_name_hint(key.text))
                failed = True
                continue
            if is_null(value_node):
                self.value_kind.type_problem(
                    value_node, variable_path, problems, 'write "" for an empty value'
                )
                failed = True
                continue
            value = self.value_kind.check(value_node, variable_path, problems)
            if isinstance(value, Invalid):
                failed = True
                continue
            variables.append(EnvVar(key.text, value))
        if failed:
            return INVALID
        total = sum(len(variable.name) + len(variable.value) for variable in variables)
        if total > MAX_ENV_TOTAL_LENGTH:
            problems.add(
                path,
                node,
                f"holds {total} characters of names and values; at most "
                f"{MAX_ENV_TOTAL_LENGTH} are allowed",
                "keep large configuration in a file in the project directory",
            )
            return INVALID
        return tuple(sorted(variables, key=lambda variable: variable.name))

    def empty(self) -> tuple[EnvVar, ...]:
        return ()

    def json_schema(self) -> JsonSchema:
        return {
            "type": "object",
            "maxProperties": MAX_ENV_VARS,
            "propertyNames": {
                "pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
                "not": {"pattern": "^[Tt][Aa][Uu]_"},
            },
            "additionalProperties": self.value_kind.json_schema(),
        }


def _check_compute(block: BlockValues, problems: ProblemCollector) -> None:
    if block.valid("gpus", "gpu_type") and block.values["gpu_type"] and block.values["gpus"] == 0:
        problems.add(
            block.path_of("gpu_type"),
            block.where("gpu_type"),
            "`gpu_type` is set but `gpus` is 0",
            "set `gpus` to the number of GPUs each worker needs, or remove `gpu_type`",
        )


def _check_runtime(block: BlockValues, problems: ProblemCollector) -> None:
    # Read from the nodes, not the values: the clash is worth reporting even while other
    # entries of `env` or `secrets` still have problems of their own.
    secrets_node = block.nodes.get("secrets")
    env_node = block.nodes.get("env")
    if not isinstance(secrets_node, SequenceNode) or not isinstance(env_node, MappingNode):
        return
    literal = {key.text for key, _value in env_node.entries}
    for index, item in enumerate(secrets_node.items):
        if not isinstance(item, MappingNode):
            continue
        for key, value in item.entries:
            if key.text == "env" and isinstance(value, ScalarNode) and value.text in literal:
                problems.add(
                    join_path(index_path(block.path_of("secrets"), index), "env"),
                    value,
                    f"{quote(value.text)} is also set in `runtime.env`",
                    "a variable comes either from a literal value or from a secret, not both",
                )


def _check_backoff(block: BlockValues, problems: ProblemCollector) -> None:
    if block.valid("initial", "max") and block.values["initial"] > block.values["max"]:
        problems.add(
            block.path_of("initial"),
            block.where("initial"),
            "`initial` is longer than `max`",
            "the wait starts at `initial` and doubles up to `max`",
        )


NAME_KIND = StringKind(
    max_length=MAX_NAME_LENGTH,
    rule=_name_problem,
    rule_hint=_name_hint,
    pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
    too_long_hint=(
        f"run names are the name, `-` and a suffix of up to {RUN_NAME_SUFFIX_MAX_LENGTH} "
        f"characters, and KubeRay allows at most {RAYJOB_NAME_MAX_LENGTH} characters "
        "in a RayJob name"
    ),
    expected="a name",
)

RUN = ObjectKind(
    (
        Field(
            "entrypoint",
            StringKind(
                max_length=4096,
                rule=_entrypoint_problem,
                rule_hint=lambda _text: (
                    "name a script inside the project directory, "
                    "e.g. `train.py`, or a command such as `python -m mypackage.train`"
                ),
                normalise=_normalise_entrypoint,
                strip=True,
                expected="a script or a command line",
            ),
            "What to start. A first word ending in `.py` (or `.sh`) is a script in the project "
            "directory, started with `python` (or `bash`); anything else is a command line.",
            required=True,
            example="train.py",
        ),
        Field(
            "workload_kind",
            EnumKind(WORKLOAD_KINDS),
            "`rayjob`: a Ray cluster (KubeRay RayJob) with one worker group; "
            "`job`: plain pods (a Kubernetes Job; several workers get torchrun rendezvous).",
            default="rayjob",
            example="rayjob",
        ),
        Field(
            "args",
            ListKind(
                StringKind(max_length=4096, min_length=0, verbatim=True, multiline=True),
                max_items=256,
                example="--epochs, 10",
            ),
            "Arguments appended to the entry point. Numbers and booleans are taken as written.",
            example="[--epochs, 10]",
        ),
        Field(
            "project_dir",
            path_kind(what="project directory", relative_to="tau.yaml's directory", example="src"),
            "The directory (relative to tau.yaml) that is shipped with the run and is the "
            "working directory when it starts.",
            default=".",
            example=".",
        ),
        Field(
            "exclude",
            ListKind(
                path_kind(
                    what="pattern",
                    relative_to="the project directory",
                    example="data/**",
                    glob=True,
                ),
                max_items=256,
                unique=True,
                sort_key=str,
                example="data/**, '*.ckpt'",
            ),
            "Glob patterns (relative to the project directory) of files not to ship.",
            example="[data/**, '*.ckpt']",
        ),
        Field(
            "max_runtime",
            DurationKind(1, MAX_RUNTIME_SECONDS),
            "Stop the run after this long (seconds, or units d/h/m/s such as `2h`, `90m`). "
            "Unset: only the workspace's limit applies.",
            default=None,
            example="2h",
        ),
    ),
    lambda values: Run(**values),
    description="What to run.",
    aliases={
        "command": "entrypoint",
        "script": "entrypoint",
        "kind": "workload_kind",
        "timeout": "max_runtime",
        "arguments": "args",
        "excludes": "exclude",
        "ignore": "exclude",
    },
)

COMPUTE = ObjectKind(
    (
        Field(
            "gpus",
            IntegerKind(
                0,
                MAX_GPUS_PER_WORKER,
                too_big_hint="that is per worker; ask for more `workers` instead",
            ),
            "GPUs per worker (`nvidia.com/gpu`; requests equal limits).",
            default=0,
            example="1",
        ),
        Field(
            "cpus",
            QuantityKind("cpu", minimum=Decimal("0.001"), maximum=Decimal(1024)),
            "CPU cores per worker, a Kubernetes quantity (`4`, `0.5`, `500m`).",
            default="1",
            example="16",
        ),
        Field(
            "memory",
            QuantityKind("memory", minimum=Decimal(2**20), maximum=Decimal(16 * 2**40)),
            "Memory per worker, a Kubernetes quantity (`64Gi`, `512Mi`).",
            default="4Gi",
            example="64Gi",
        ),
        Field(
            "workers",
            IntegerKind(1, MAX_WORKERS),
            "How many workers (Ray worker pods, or Job pods).",
            default=1,
            example="2",
        ),
        Field(
            "gpu_type",
            StringKind(
                max_length=63,
                rule=_label_problem("GPU type"),
                rule_hint=lambda _text: (
                    "use the name of a flavor your workspace offers, e.g. `h100`"
                ),
                pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
            ),
            "The GPU flavor to run on (a Kueue ResourceFlavor your workspace offers, "
            "e.g. `h100`). Unset: any flavor the workspace's queue admits.",
            default=None,
            example="h100",
        ),
    ),
    lambda values: Compute(**values),
    description="Resources of each worker, and how many workers.",
    checks=(_check_compute,),
    aliases={
        "replicas": "workers",
        "nodes": "workers",
        "num_nodes": "workers",
        "flavor": "gpu_type",
        "accelerator": "gpu_type",
        "gpu": "gpus",
        "cpu": "cpus",
        "mem": "memory",
    },
)

SECRET_REF = ObjectKind(
    (
        Field(
            "env",
            StringKind(max_length=128, rule=env_name_problem, rule_hint=_env_name_hint),
            "The environment variable the workload reads the value from.",
            required=True,
            example="WANDB_API_KEY",
        ),
        Field(
            "secret",
            StringKind(max_length=253, rule=_secret_name_problem),
            "The Kubernetes Secret, in the workspace's namespace.",
            required=True,
            example="wandb",
        ),
        Field(
            "key",
            StringKind(max_length=253, rule=_secret_key_problem, pattern=r"^[-._a-zA-Z0-9]+$"),
            "The key inside the Secret.",
            required=True,
            example="api-key",
        ),
    ),
    lambda values: SecretRef(**values),
    description="An environment variable whose value comes from a Kubernetes Secret.",
    aliases={"name": "env", "variable": "env", "secret_name": "secret", "secretname": "secret"},
    expected="a secret reference ({env, secret, key})",
)

RUNTIME = ObjectKind(
    (
        Field(
            "image",
            StringKind(
                max_length=512,
                rule=_image_problem,
                rule_hint=_image_hint,
                pattern=_IMAGE_PATTERN,
            ),
            "The container image. Unset: the workspace's default image.",
            default=None,
            example="python:3.12-slim",
        ),
        Field(
            "pip",
            ListKind(
                StringKind(
                    max_length=1024,
                    rule=_requirement_problem,
                    rule_hint=_requirement_hint,
                    strip=True,
                ),
                max_items=128,
                unique=True,
                example="torch>=2.4.0",
            ),
            "Python requirements installed before the run starts (PEP 508, one per item).",
            example="[torch>=2.4.0]",
        ),
        Field(
            "env",
            EnvKind(),
            "Environment variables with literal values. Names starting with `TAU_` are "
            "reserved for the platform.",
            example="{WANDB_PROJECT: vision}",
        ),
        Field(
            "secrets",
            ListKind(
                SECRET_REF,
                max_items=64,
                unique_key=lambda secret: secret.env,
                sort_key=lambda secret: secret.env,
                example="{env: WANDB_API_KEY, secret: wandb, key: api-key}",
            ),
            "Environment variables whose values come from Kubernetes Secrets (Kubernetes backend).",
            example="[{env: WANDB_API_KEY, secret: wandb, key: api-key}]",
        ),
    ),
    lambda values: Runtime(**values),
    description="The software the workload runs in.",
    checks=(_check_runtime,),
    aliases={
        "requirements": "pip",
        "packages": "pip",
        "environment": "env",
        "container": "image",
        "secret": "secrets",
    },
)

QUEUE = ObjectKind(
    (
        Field(
            "priority",
            StringKind(max_length=63, rule=_priority_problem),
            "A priority your workspace allows (a Kueue WorkloadPriorityClass). "
            "Unset: the workspace's default priority.",
            default=None,
            example="normal",
        ),
        Field(
            "name",
            StringKind(max_length=63, rule=_label_problem("queue name")),
            "One of your workspace's queues (a Kueue LocalQueue). "
            "Unset: the workspace's default queue.",
            default=None,
            example="default",
        ),
    ),
    lambda values: Queue(**values),
    description="Where the run waits for capacity.",
    aliases={"priority_class": "priority", "queue": "name", "local_queue": "name"},
)

BACKOFF = ObjectKind(
    (
        Field(
            "initial",
            DurationKind(0, 3600),
            "Wait before the first retry.",
            default=30,
            example="30s",
        ),
        Field(
            "max",
            DurationKind(1, 86400),
            "The longest wait; each retry doubles the previous wait up to this.",
            default=600,
            example="10m",
        ),
    ),
    lambda values: Backoff(**values),
    description="How long to wait before each retry.",
    checks=(_check_backoff,),
    aliases={"maximum": "max", "start": "initial", "min": "initial"},
)

RESILIENCE = ObjectKind(
    (
        Field(
            "max_retries",
            IntegerKind(0, MAX_RETRIES),
            "How many times a failed run is tried again (0: never).",
            default=3,
            example="3",
        ),
        Field(
            "retry_on",
            ListKind(
                EnumKind(FAILURE_CLASSES),
                max_items=len(FAILURE_CLASSES),
                unique=True,
                sort_key=FAILURE_CLASSES.index,
                example="preempted, node_failure",
            ),
            "Which failure classes are retried: " + ", ".join(FAILURE_CLASSES) + ".",
            default=DEFAULT_RETRY_ON,
            example="[preempted, evicted, node_failure, infrastructure]",
        ),
        Field("backoff", BACKOFF, "How long to wait before each retry."),
        Field(
            "checkpoint_dir",
            path_kind(
                what="checkpoint directory",
                relative_to="the project directory",
                example="checkpoints",
            ),
            "Where the program writes checkpoints, relative to the project directory as it "
            "runs; `TAU_CHECKPOINT_DIR` points there and the newest complete checkpoint is "
            "handed to the next attempt in `TAU_RESUME_FROM`. Unset: the platform chooses "
            "(read `TAU_CHECKPOINT_DIR`).",
            default=None,
            example="checkpoints",
        ),
    ),
    lambda values: Resilience(**values),
    description="When a failed run is retried, and where its checkpoints are.",
    aliases={"retries": "max_retries", "checkpoints": "checkpoint_dir"},
)

OUTPUTS = ObjectKind(
    (
        Field(
            "metrics_file",
            StringKind(
                max_length=1024,
                rule=_metrics_file_problem,
                normalise=normalise_relative_path,
                pattern=r"^(?![/~\\])(?![A-Za-z]:)(?!(.*/)?\.\.(/|$))[^\\]*[^/\\]$",
                expected="a relative path",
            ),
            "The JSON-lines file under `TAU_OUTPUT_DIR` that metrics rows are appended to.",
            default="metrics.jsonl",
            example="metrics.jsonl",
        ),
        Field(
            "artifacts",
            ListKind(
                path_kind(
                    what="pattern",
                    relative_to="TAU_OUTPUT_DIR",
                    example="model/**",
                    glob=True,
                ),
                max_items=64,
                unique=True,
                sort_key=str,
                example="model/**",
            ),
            "Glob patterns (relative to `TAU_OUTPUT_DIR`) of files kept in the run's evidence.",
            example="[model/**, '*.json']",
        ),
    ),
    lambda values: Outputs(**values),
    description="What the run writes, and what is kept.",
    aliases={"metrics": "metrics_file", "files": "artifacts"},
)

EXPERIMENT = ObjectKind(
    (
        Field(
            "project",
            StringKind(max_length=100, verbatim=True, rule=_label_text_problem),
            "A project name, for grouping and comparing runs.",
            default=None,
            example="vision",
        ),
        Field(
            "group",
            StringKind(max_length=100, verbatim=True, rule=_label_text_problem),
            "A group within the project (a sweep, an ablation).",
            default=None,
            example="lr-sweep",
        ),
        Field(
            "tags",
            ListKind(
                StringKind(max_length=63, verbatim=True, rule=_tag_problem),
                max_items=32,
                unique=True,
                sort_key=str,
                example="baseline, resnet",
            ),
            "Labels for finding runs: letters, digits, `-`, `_` and `.`.",
            example="[baseline, resnet]",
        ),
    ),
    lambda values: Experiment(**values),
    description="Labels for comparing runs; they do not change how a run executes.",
    aliases={"labels": "tags", "name": "project"},
)

ROOT = ObjectKind(
    (
        Field(
            "schema_version",
            SchemaVersionKind(),
            "The tau.yaml schema version; always `1` for this version.",
            required=True,
            example="1",
        ),
        Field(
            "name",
            NAME_KIND,
            f"The workload's name: a DNS-1035 label of at most {MAX_NAME_LENGTH} characters "
            "(lower-case letters, digits and `-`, starting with a letter). Run names are built "
            "from it.",
            required=True,
            example="my-run",
        ),
        Field("run", RUN, "What to run.", required=True, example="{entrypoint: train.py}"),
        Field("compute", COMPUTE, "Resources of each worker, and how many workers."),
        Field("runtime", RUNTIME, "The software the workload runs in."),
        Field("queue", QUEUE, "Where the run waits for capacity."),
        Field("resilience", RESILIENCE, "Retries and checkpoints."),
        Field("outputs", OUTPUTS, "What the run writes, and what is kept."),
        Field("experiment", EXPERIMENT, "Labels for comparing runs."),
    ),
    lambda values: Spec(**values),
    description="A TauGrid workload (tau.yaml, schema version 1).",
    aliases={"version": "schema_version", "resources": "compute", "job": "run"},
)


def _blocks(kind: ObjectKind[Any], path: str) -> list[tuple[str, ObjectKind[Any]]]:
    found = [(path, kind)]
    for name, field in kind.fields.items():
        if isinstance(field.kind, ObjectKind):
            found.extend(_blocks(field.kind, join_path(path, name)))
    return found


def _index_field_homes() -> None:
    """Teach every block where the other blocks' keys live, for "belongs in" hints."""
    blocks = _blocks(ROOT, "")
    homes: dict[str, list[str]] = {}
    for path, kind in blocks:
        for name in kind.fields:
            homes.setdefault(name, []).append(path)
    for _path, kind in blocks:
        kind.elsewhere = homes


_index_field_homes()

# --------------------------------------------------------------------------- entry points


def check_document(root: Node | None, problems: ProblemCollector) -> Spec | None:
    """The Spec for a loaded document, or None with the reasons in ``problems``."""
    if root is None:
        return None
    if is_null(root) or (isinstance(root, MappingNode) and not root.entries and not problems):
        problems.add(
            DOCUMENT_PATH,
            root,
            "the file has no settings",
            "a tau.yaml starts with `schema_version: 1` and `name: …`",
        )
        return None
    if not isinstance(root, MappingNode):
        problems.add(
            DOCUMENT_PATH,
            root,
            f"expected a mapping of keys such as `schema_version` and `name`, got {describe(root)}",
            "a tau.yaml starts with `schema_version: 1` and `name: …`",
        )
        return None
    if _other_schema_version(root, problems):
        return None
    spec = ROOT.check(root, "", problems)
    return None if isinstance(spec, Invalid) else spec


def _other_schema_version(root: MappingNode, problems: ProblemCollector) -> bool:
    """A file for another schema version gets that one problem, not one per unknown key."""
    for key, value in root.entries:
        if (
            key.text == "schema_version"
            and isinstance(value, ScalarNode)
            and value.kind == "int"
            and value.value != SCHEMA_VERSION
        ):
            ROOT.fields["schema_version"].kind.check(value, "schema_version", problems)
            return True
    return False


def check_source(source: str | bytes) -> tuple[Spec | None, list[SpecProblem]]:
    """Load, check and normalise tau.yaml text: the Spec, or None and every problem."""
    problems = ProblemCollector()
    root = load_yaml(source, problems)
    spec = check_document(root, problems)
    if problems:
        return None, problems.sorted()
    return spec, []


def spec_from_data(data: Mapping[str, Any]) -> Spec:
    """A Spec from JSON-like data (``Spec.to_dict()`` output), by the same rules as a file."""
    problems = ProblemCollector()
    try:
        root = from_python(data)
    except NotJsonLike as error:
        raise SpecError(
            [SpecProblem(DOCUMENT_PATH, 0, 0, f"not JSON-like data: {error}")]
        ) from None
    spec = check_document(root, problems)
    if problems or spec is None:
        raise SpecError(problems.sorted())
    return spec


def json_schema() -> JsonSchema:
    """The JSON Schema (draft 2020-12) of schema version 1, for editors and web forms.

    It states everything JSON Schema can: types, keys, required keys, bounds, patterns and
    defaults. A few rules only the checker applies (cross-field rules, quantity bounds of
    strings, duplicate keys, …), so a document valid here may still get problems from
    ``validate``; every document ``validate`` accepts is valid here.
    """
    schema = ROOT.json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "tau.yaml (TauGrid workload, schema version 1)",
        **schema,
    }


def field_paths() -> Sequence[str]:
    """Every field's dotted path (``compute.gpus``), for documentation and tests."""
    paths: list[str] = []

    def walk(kind: ObjectKind[Any], prefix: str) -> None:
        for name, field in kind.fields.items():
            path = join_path(prefix, name)
            paths.append(path)
            if isinstance(field.kind, ObjectKind):
                walk(field.kind, path)

    walk(ROOT, "")
    return paths
