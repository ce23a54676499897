"""Schema version 1 of tau.yaml: every block, field, default and bound, in one table.

The same definitions check a file, normalise it into a ``Spec`` and export the JSON Schema;
``docs/tau-yaml.md`` documents them for people (a test keeps the two in step). Bounds are
deliberately generous but finite: they exist so that no spec can ask the server for
unbounded work, not to second-guess a workspace's policy, which is checked at submission.
"""

from __future__ import annotations

import keyword
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, Final

from tau.k8s_names import (
    dns1035_label_problem,
    dns1123_label_problem,
    dns1123_subdomain_problem,
    label_value_problem,
)
from tau.printable import hidden_character_problem
from tau.quantity import parse_quantity
from tau.spec.dialects import Reading, read_document
from tau.spec.fields import (
    INVALID,
    BlockCheck,
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
    HEAD_DEFAULT,
    SCHEMA_VERSION,
    WORKLOAD_KINDS,
    AssetInput,
    Autoscaling,
    Backoff,
    Compute,
    DatasetInput,
    EnvVar,
    Execution,
    Experiment,
    Head,
    Inputs,
    Limits,
    ModelInput,
    ModelRef,
    OutputAsset,
    Outputs,
    Queue,
    Resilience,
    Run,
    Runtime,
    SecretRef,
    Serve,
    Spec,
    Storage,
    SweepParameter,
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
#: A sweep's trials: every combination of its grid, times ``num_samples``.
MAX_TRIALS = 256
MAX_SWEEP_PARAMETERS = 32
MAX_SWEEP_VALUES = 64
MAX_RUNTIME_SECONDS = 30 * 86400
MAX_ENV_VARS = 128
MAX_ENV_VALUE_LENGTH = 32 * 1024
#: Names plus values of all ``runtime.env`` entries; well under Kubernetes' object size limit.
MAX_ENV_TOTAL_LENGTH = 64 * 1024
RESERVED_ENV_PREFIX = "TAU_"
#: Datasets one run reads (``inputs.datasets``).
MAX_DATASETS = 32
#: Models one run reads (``inputs.models``).
MAX_MODELS = 8
#: Names of datasets, models and version aliases in a workspace's catalog: lower-case letters,
#: digits, ``.``, ``_`` and ``-``, starting with a letter or a digit.
ASSET_NAME_MAX_LENGTH = 63
ASSET_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
#: Version numbers count from 1 and have at most this many digits.
MAX_VERSION_DIGITS = 9
#: Replicas of an endpoint (``serve.replicas``, ``serve.autoscaling.max_replicas``).
MAX_REPLICAS = 64
#: Requests in flight per replica that Ray Serve's autoscaler aims at, at most.
MAX_TARGET_ONGOING_REQUESTS = 1000
MAX_IMPORT_PATH_LENGTH = 256
MAX_ROUTE_PREFIX_LENGTH = 256

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
    return hidden_character_problem(text, f"the label {quote(text)}")


def _metrics_file_problem(text: str) -> str | None:
    problem = relative_path_problem(text, what="metrics file")
    if problem:
        return problem
    if text.endswith("/") or normalise_relative_path(text) == ".":
        return f"{quote(text)} is a directory; name the file the metrics rows go to"
    return None


_ASSET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
_DIGITS = re.compile(r"[0-9]+")
#: A version number without leading zeros, or an alias that is not all digits.
_VERSION_PATTERN = (
    rf"^(?:[1-9][0-9]{{0,{MAX_VERSION_DIGITS - 1}}}|(?![0-9]+$)[a-z0-9][a-z0-9._-]{{0,62}})$"
)
_ASSET_NAME_RULES = (
    "use lower-case letters, digits, `.`, `_` and `-`, starting with a letter or a digit"
)


def _asset_name_problem(what: str) -> Callable[[str], str | None]:
    def problem(text: str) -> str | None:
        if _ASSET_NAME.fullmatch(text):
            return None
        return f"{quote(text)} is not a valid {what} name: {_ASSET_NAME_RULES}"

    return problem


def _asset_name_hint(example: str) -> Callable[[str], str]:
    def hint(text: str) -> str:
        suggestion = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-").lstrip("._")
        suggestion = suggestion[:ASSET_NAME_MAX_LENGTH]
        if suggestion and suggestion != text and _ASSET_NAME.fullmatch(suggestion):
            return f"try `{suggestion}`"
        return f"e.g. `{example}`"

    return hint


def _asset_name_kind(what: str, example: str) -> StringKind:
    return StringKind(
        max_length=ASSET_NAME_MAX_LENGTH,
        rule=_asset_name_problem(what),
        rule_hint=_asset_name_hint(example),
        pattern=ASSET_NAME_PATTERN,
        expected=f"a {what} name",
    )


def _version_problem(text: str) -> str | None:
    if _DIGITS.fullmatch(text):
        if int(text) == 0:
            return f"there is no version {text}: versions are numbered from 1"
        if text.startswith("0"):
            return f"the version number {quote(text)} has leading zeros"
        if len(text) > MAX_VERSION_DIGITS:
            return (
                f"{quote(text)} is not a version number: "
                f"they have at most {MAX_VERSION_DIGITS} digits"
            )
        return None
    if _ASSET_NAME.fullmatch(text):
        return None
    return f"{quote(text)} is neither a version number nor an alias"


def _version_hint(text: str, what: str = "dataset") -> str:
    if _DIGITS.fullmatch(text) and 0 < int(text) < 10**MAX_VERSION_DIGITS:
        return f"write `{int(text)}`"
    if _DIGITS.fullmatch(text):
        return f"name a version the {what} has, or leave `version` out for the newest one"
    if "@" in text:
        return f"write only what follows `@` here, and the {what}'s name in `name`"
    if _ASSET_NAME.fullmatch(text.lower()):
        return f"aliases are lower-case: `{text.lower()}`"
    return f"write a number such as `3`, or an alias such as `train` ({_ASSET_NAME_RULES})"


def _nesting(path: str, other: str) -> str | None:
    """How two normalised relative folders overlap: ``same``, ``inside`` (``path`` is inside
    ``other``), ``holds`` (``other`` is inside ``path``), or None when they are apart."""
    if path == other:
        return "same"
    if path.startswith(other + "/"):
        return "inside"
    if other.startswith(path + "/"):
        return "holds"
    return None


#: A relative path that names a folder inside its directory: the path rules of ``path_kind``,
#: and not the directory itself (``""``, ``.``, ``./``).
_FOLDER_PATTERN = r"^(?![/~\\])(?![A-Za-z]:)(?!(.*/)?\.\.(/|$))(?!(\.?/)*\.?$)[^\\]*$"


def _folder_kind(*, what: str, directory: str, example: str) -> StringKind:
    """A folder inside ``directory`` (a relative path, normalised), never ``directory`` itself."""

    def problem(text: str) -> str | None:
        if not text or normalise_relative_path(text) == ".":
            shown = quote(text) if text else "an empty path"
            return f"{shown} is the whole of `{directory}`; name a folder inside it"
        return relative_path_problem(text, what=what)

    return StringKind(
        max_length=1024,
        min_length=0,
        rule=problem,
        rule_hint=lambda _text: f"write a folder relative to `{directory}`, e.g. `{example}`",
        normalise=normalise_relative_path,
        pattern=_FOLDER_PATTERN,
        expected=f"a relative {what}",
    )


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


def _limit_problems(
    block: BlockValues, requests: Mapping[str, str], problems: ProblemCollector
) -> None:
    """Limits below their requests: Kubernetes refuses such a pod."""
    limits = block.values.get("limits")
    if not isinstance(limits, Limits):
        return
    node = block.nodes.get("limits")
    for resource, limit in (("cpus", limits.cpus), ("memory", limits.memory)):
        request = requests.get(resource)
        if limit is None or request is None:
            continue
        if parse_quantity(limit) < parse_quantity(request):
            where: Any = block.node
            if isinstance(node, MappingNode):
                where = next((v for k, v in node.entries if k.text == resource), node)
            problems.add(
                join_path(block.path_of("limits"), resource),
                where,
                f"the limit {limit} is below the request of {request} (`{resource}`)",
                "a limit is at least the request; remove it to make it equal the request",
            )


def _check_head(block: BlockValues, problems: ProblemCollector) -> None:
    if block.valid("cpus", "memory"):
        _limit_problems(
            block, {"cpus": block.values["cpus"], "memory": block.values["memory"]}, problems
        )


def _check_compute(block: BlockValues, problems: ProblemCollector) -> None:
    if block.valid("cpus", "memory"):
        _limit_problems(
            block, {"cpus": block.values["cpus"], "memory": block.values["memory"]}, problems
        )
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

ENTRYPOINT_KIND = StringKind(
    max_length=4096,
    rule=_entrypoint_problem,
    rule_hint=lambda _text: (
        "name a script inside the project directory, "
        "e.g. `train.py`, or a command such as `python -m mypackage.train`"
    ),
    normalise=_normalise_entrypoint,
    strip=True,
    expected="a script or a command line",
)
_ENTRYPOINT_EXAMPLE = "train.py"


def _check_run(block: BlockValues, problems: ProblemCollector) -> None:
    """``entrypoint`` is required by runs and refused by endpoints, which start
    ``serve.import_path``; so are the keys that only make sense with an entry point."""
    if not block.valid("workload_kind"):
        return
    if block.values["workload_kind"] != "rayservice":
        if block.valid("entrypoint") and block.values["entrypoint"] is None:
            path = block.path_of("entrypoint")
            # The words a required key has always had, absent or null.
            written = block.nodes.get("entrypoint")
            if written is None:
                problems.add(
                    path,
                    block.node,
                    "missing required key `entrypoint`",
                    f"add `entrypoint: {_ENTRYPOINT_EXAMPLE}`",
                )
            else:
                ENTRYPOINT_KIND.type_problem(
                    written, path, problems, f"give a value, e.g. {_ENTRYPOINT_EXAMPLE}"
                )
            block.values["entrypoint"] = INVALID
        return
    refused = (
        (
            "entrypoint",
            "an endpoint has no entry point: it starts the application in `serve.import_path`",
            "remove `run.entrypoint`",
        ),
        (
            "args",
            "an endpoint has no entry point to pass `args` to",
            "remove `run.args`; configure the application with `runtime.env`",
        ),
        (
            "max_runtime",
            "an endpoint runs until it is stopped; it has no `max_runtime`",
            "remove `run.max_runtime`",
        ),
    )
    for name, message, hint in refused:
        if block.valid(name) and block.values[name]:
            problems.add(block.path_of(name), block.where(name), message, hint)


RUN = ObjectKind(
    (
        Field(
            "entrypoint",
            ENTRYPOINT_KIND,
            "What to start. A first word ending in `.py` (or `.sh`) is a script in the project "
            "directory, started with `python` (or `bash`); anything else is a command line. "
            "Required for `rayjob` and `job`; an endpoint (`rayservice`) has none.",
            default=None,
            example=_ENTRYPOINT_EXAMPLE,
        ),
        Field(
            "workload_kind",
            EnumKind(WORKLOAD_KINDS),
            "`rayjob`: a Ray cluster (KubeRay RayJob) with one worker group; "
            "`job`: plain pods (a Kubernetes Job; several workers get torchrun rendezvous); "
            "`rayservice`: an endpoint (a KubeRay RayService) serving the Ray Serve "
            "application of the `serve` block, deployed with `tau serve deploy`.",
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
    checks=(_check_run,),
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


def _cpu_kind() -> QuantityKind:
    return QuantityKind("cpu", minimum=Decimal("0.001"), maximum=Decimal(1024))


def _memory_kind() -> QuantityKind:
    return QuantityKind("memory", minimum=Decimal(2**20), maximum=Decimal(16 * 2**40))


LIMITS = ObjectKind(
    (
        Field(
            "cpus",
            _cpu_kind(),
            "The CPU limit, at least the request. Unset: the request.",
            default=None,
            example="16",
        ),
        Field(
            "memory",
            _memory_kind(),
            "The memory limit, at least the request. Unset: the request.",
            default=None,
            example="128Gi",
        ),
    ),
    lambda values: Limits(**values),
    description="Limits that differ from the requests.",
    aliases={"cpu": "cpus", "mem": "memory"},
)


def _same_limits(limits: Limits, cpus: str, memory: str) -> Limits:
    """Limits equal to the requests are written as unset: one meaning, one normal form."""
    return Limits(
        cpus=None if limits.cpus in (None, cpus) else limits.cpus,
        memory=None if limits.memory in (None, memory) else limits.memory,
    )


def _build_head(values: dict[str, Any]) -> Head:
    return Head(
        cpus=values["cpus"],
        memory=values["memory"],
        limits=_same_limits(values["limits"], values["cpus"], values["memory"]),
    )


HEAD = ObjectKind(
    (
        Field(
            "cpus",
            _cpu_kind(),
            "CPU cores requested for the Ray head.",
            default=HEAD_DEFAULT.cpus,
            example="1",
        ),
        Field(
            "memory",
            _memory_kind(),
            "Memory requested for the Ray head.",
            default=HEAD_DEFAULT.memory,
            example="4Gi",
        ),
        Field("limits", LIMITS, "The head's limits where they differ from its requests."),
    ),
    _build_head,
    description="The Ray head: it runs the driver, the GCS and the dashboard; no GPUs.",
    checks=(_check_head,),
    aliases={"cpu": "cpus", "mem": "memory"},
)


def _build_compute(values: dict[str, Any]) -> Compute:
    head = values["head"]
    # The platform's default head, written out, is the same as no head at all.
    if head == HEAD_DEFAULT:
        head = None
    return Compute(
        **{
            **values,
            "limits": _same_limits(values["limits"], values["cpus"], values["memory"]),
            "head": head,
        }
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
        Field(
            "limits",
            LIMITS,
            "Each worker's limits where they differ from its requests (`cpus`, `memory`). "
            "Unset: limits equal requests.",
        ),
        Field(
            "head",
            HEAD,
            "The Ray head's size (RayJobs and endpoints; a Job has none). Unset: "
            f"{HEAD_DEFAULT.cpus} CPUs and {HEAD_DEFAULT.memory}.",
            default=None,
            example="{cpus: 1, memory: 4Gi}",
        ),
    ),
    _build_compute,
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


class VersionKind(StringKind):
    """A dataset's or a model's version: a number (``3``, quoted or not) or an alias
    (``train``), kept as text; numbers are written in plain decimal digits."""

    def __init__(self, what: str = "dataset") -> None:
        super().__init__(
            max_length=ASSET_NAME_MAX_LENGTH,
            rule=_version_problem,
            rule_hint=lambda text: _version_hint(text, what),
            pattern=_VERSION_PATTERN,
            expected="a version number or an alias",
        )
        self.what = what

    def check_node(self, node: Node, path: str, problems: ProblemCollector) -> str | Invalid:
        if not isinstance(node, ScalarNode) or node.kind != "int":
            return super().check_node(node, path, problems)
        if _DIGITS.fullmatch(node.text):
            return self.check_text(node.text, node, path, problems)
        if isinstance(node.value, int) and node.value < 1:
            problems.add(
                path,
                node,
                f"there is no version {node.text}: versions are numbered from 1",
                f"name a version the {self.what} has, or leave `version` out for the newest one",
            )
        else:
            problems.add(
                path,
                node,
                f"write version numbers in plain decimal digits, not {quote(node.text)}",
                f"YAML readers disagree about forms like `0x10` and `1_000`; "
                f"this one means {node.value}",
            )
        return INVALID

    def json_schema(self) -> JsonSchema:
        number: JsonSchema = {
            "type": "integer",
            "minimum": 1,
            "maximum": 10**MAX_VERSION_DIGITS - 1,
        }
        return {"anyOf": [super().json_schema(), number]}


#: What an ``inputs`` list holds, by kind: the example name, and the command that lists them.
_INPUT_KINDS = {
    "dataset": ("wiki", "train", "tau data dataset list"),
    "model": ("tiny-gpt", "production", "tau data model list"),
}


class _AssetInputKind(ObjectKind[AssetInput]):
    """An input names a catalog asset or the pipeline stage that makes one: its JSON Schema
    says so (exactly one of ``name`` and ``from``; no ``version`` with ``from``)."""

    def json_schema(self) -> JsonSchema:
        return _name_or_from(super().json_schema())


def _name_or_from(schema: JsonSchema) -> JsonSchema:
    """The JSON Schema of a block that names a catalog asset or the pipeline stage that
    makes one: exactly one of ``name`` and ``from``, and no ``version`` with ``from``."""
    schema.pop("required", None)
    for key in ("name", "from"):
        # Either is left out rather than null (a null one counts as left out).
        prop = schema["properties"][key]
        (given,) = [option for option in prop.pop("anyOf") if option.get("type") != "null"]
        prop.pop("default", None)
        schema["properties"][key] = {**given, **prop}
    schema["oneOf"] = [
        {"required": ["name"]},
        {"required": ["from"], "not": {"required": ["version"]}},
    ]
    return schema


def _asset_input(kind: str, build: Callable[..., AssetInput]) -> ObjectKind[AssetInput]:
    """An item of ``inputs.datasets`` or ``inputs.models``: a catalog asset at one version."""
    name, alias, command = _INPUT_KINDS[kind]
    return _AssetInputKind(
        (
            Field(
                "name",
                _asset_name_kind(kind, name),
                f"A {kind} of your workspace (`{command}`). Required, unless `from` names "
                f"the pipeline stage that makes the {kind}.",
                default=None,
                example=name,
            ),
            Field(
                "version",
                VersionKind(kind),
                f"A version number (`3`) or an alias (`{alias}`). Resolved once, at "
                "submission, to the version it names then: every attempt of the run reads that "
                "version, and the run records it. Default: `latest`, the newest ready version.",
                default="latest",
                example=alias,
            ),
            Field(
                "path",
                _folder_kind(what=f"{kind} path", directory="TAU_DATA_DIR", example=name),
                f"Where the {kind}'s files appear, read-only, relative to `TAU_DATA_DIR`. "
                f"Unset: the {kind}'s name (with `from`: the stage's).",
                default=None,
                example=name,
            ),
            Field(
                "from",
                StringKind(
                    max_length=STAGE_NAME_MAX_LENGTH,
                    rule=_stage_name_problem,
                    pattern=STAGE_NAME_PATTERN,
                    expected="a stage's name",
                ),
                f"In a pipeline's stage (pipeline.yaml): the stage before this one whose run "
                f"made the {kind} version to read, instead of `name` and `version` (`{{from: "
                f"prepare}}`). Resolved when this stage starts, and pinned in its record. The "
                f"stage must be one this stage needs, and its tau.yaml must have "
                f"`outputs.{kind}`.",
                default=None,
                example="prepare",
            ),
        ),
        lambda values: build(
            name=values["name"] or "",
            version=values["version"],
            path=values["path"] or values["name"] or values["from"],
            from_stage=values["from"],
        ),
        description=f"A {kind} the run reads, at one version.",
        checks=(_one_source(kind),),
        aliases={
            kind: "name",
            "alias": "version",
            "tag": "version",
            "mount": "path",
            "folder": "path",
            "dir": "path",
            "directory": "path",
        },
        expected=f"a {kind} ({{name, version, path}})",
    )


#: A pipeline stage's name, as pipeline.yaml allows it (tau.pipeline, which imports this
#: module, holds the same rule).
STAGE_NAME_MAX_LENGTH: Final = 32
STAGE_NAME_PATTERN: Final = rf"^[a-z]([-a-z0-9]{{0,{STAGE_NAME_MAX_LENGTH - 2}}}[a-z0-9])?$"


def _stage_name_problem(text: str) -> str | None:
    problem = dns1035_label_problem(text, max_length=STAGE_NAME_MAX_LENGTH)
    return None if problem is None else f"the stage name {quote(text)} {problem}"


def _one_source(kind: str, what: str = "an input") -> BlockCheck:
    """An input (or ``serve.model``) names a catalog asset (``name``, ``version``) or the
    stage that makes it (``from``): exactly one of the two."""
    example, _alias, _command = _INPUT_KINDS[kind]

    def check(block: BlockValues, problems: ProblemCollector) -> None:
        values, nodes = block.values, block.nodes
        if values.get("name") is None and values.get("from") is None and "name" not in nodes:
            if "from" not in nodes:
                problems.add(
                    join_path(block.path, "name"),
                    block.node,
                    "missing required key `name`",
                    f"add `name: {example}`",
                )
                block.values["name"] = INVALID
            return
        if "from" in nodes and "name" in nodes:
            problems.add(
                join_path(block.path, "from"),
                nodes["from"],
                f"{what} names a {kind} (`name`) or the stage that makes it (`from`), not both",
                "remove one of them",
            )
            block.values["from"] = INVALID
        elif "from" in nodes and "version" in nodes:
            problems.add(
                join_path(block.path, "version"),
                nodes["version"],
                f"the version {what} reads with `from` is the one its stage made",
                "remove `version`",
            )
            block.values["version"] = INVALID

    return check


def _input_item_hint(text: str, kind: str) -> str:
    """For an input written as text (``wiki@train``): the mapping it should be."""
    name, at, version = text.partition("@")
    if _ASSET_NAME.fullmatch(name) and not at:
        return f"write `{{name: {name}}}`"
    if _ASSET_NAME.fullmatch(name) and _version_problem(version) is None:
        return f"write `{{name: {name}, version: {version}}}`"
    example, alias, _command = _INPUT_KINDS[kind]
    return (
        f"write `{{name: {example}, version: {alias}}}`, or `name:` and `version:` on lines "
        "of their own"
    )


def _overlap_message(where: str, item: str, other_path: str, nesting: str) -> str:
    return {
        "same": f"{where} is taken by {item}",
        "inside": f"{where} is inside the folder of {item}, {quote(other_path)}",
        "holds": f"{where} holds the folder of {item}, {quote(other_path)}",
    }[nesting]


class AssetListKind(ListKind[AssetInput]):
    """``inputs.datasets`` or ``inputs.models``: each version once, each in a folder of its
    own under ``TAU_DATA_DIR`` (none inside another's, since each is staged there). The order
    is kept as written, so that ``spec.inputs.datasets[i]`` is the file's item ``i``."""

    def __init__(self, kind: str, build: Callable[..., AssetInput]) -> None:
        name, alias, _command = _INPUT_KINDS[kind]
        super().__init__(
            _asset_input(kind, build),
            max_items=MAX_DATASETS if kind == "dataset" else MAX_MODELS,
            example=f"{{name: {name}, version: {alias}}}",
        )
        self.kind = kind

    def check_node(
        self, node: Node, path: str, problems: ProblemCollector
    ) -> tuple[AssetInput, ...] | Invalid:
        if not isinstance(node, SequenceNode) or len(node.items) > self.max_items:
            return super().check_node(node, path, problems)  # the list's own problem
        inputs: list[tuple[int, AssetInput]] = []
        failed = False
        for index, item in enumerate(node.items):
            item_path = index_path(path, index)
            if isinstance(item, ScalarNode) and item.kind == "str":
                hint = _input_item_hint(item.text, self.kind)
                self.item.type_problem(item, item_path, problems, hint)
                failed = True
                continue
            asset = self.item.check(item, item_path, problems)
            if isinstance(asset, Invalid):
                failed = True
                continue
            if self._clashes(asset, item, item_path, inputs, problems):
                failed = True
                continue
            inputs.append((index, asset))
        if failed:
            return INVALID
        return tuple(asset for _index, asset in inputs)

    def _clashes(
        self,
        asset: AssetInput,
        node: Node,
        path: str,
        earlier: Sequence[tuple[int, AssetInput]],
        problems: ProblemCollector,
    ) -> bool:
        """Whether ``asset`` is the same version at the same name as an earlier item, or
        overlaps its folder (then reported at this, the later, item). One dataset (or model)
        may be read twice, two versions in two folders (to compare them)."""
        for index, other in earlier:
            if other.key == asset.key:
                shown = (
                    f"`from: {asset.from_stage}`"
                    if asset.from_stage
                    else quote(f"{asset.name}@{asset.version}")
                )
                problems.add(
                    join_path(path, "from" if asset.from_stage else "name"),
                    _entry(node, "from" if asset.from_stage else "name") or node,
                    f"{shown} is listed twice (also item {index + 1} of the list)",
                    "remove one of them",
                )
                return True
        for index, other in earlier:
            nesting = _nesting(asset.path, other.path)
            if nesting is None:
                continue
            written = _entry(node, "path")
            where = f"the path {quote(asset.path)}"
            if written is None:
                where += f" (the {self.kind}'s name, as there is no `path`)"
            problems.add(
                join_path(path, "path"),
                written or node,
                _overlap_message(where, f"item {index + 1} (`{other.name}`)", other.path, nesting),
                f"give each {self.kind} a folder of its own under TAU_DATA_DIR with `path`, "
                "none inside another",
            )
            return True
        return False


def _check_inputs(block: BlockValues, problems: ProblemCollector) -> None:
    """Every model's folder is apart from every dataset's: both are staged under
    ``TAU_DATA_DIR``. Reported at the model, the one a user adds to a spec that reads data."""
    if not block.valid("datasets", "models"):
        return
    models_node = block.nodes.get("models")
    if not isinstance(models_node, SequenceNode):
        return  # no models were written: nothing to keep apart
    for index, model in enumerate(block.values["models"]):
        for dataset_index, dataset in enumerate(block.values["datasets"]):
            nesting = _nesting(model.path, dataset.path)
            if nesting is None:
                continue
            item = models_node.items[index]
            written = _entry(item, "path")
            where = f"the path {quote(model.path)}"
            if written is None:
                where += " (the model's name, as there is no `path`)"
            problems.add(
                join_path(index_path(block.path_of("models"), index), "path"),
                written or item,
                _overlap_message(
                    where,
                    f"the dataset `{dataset.name}` (`inputs.datasets[{dataset_index}]`)",
                    dataset.path,
                    nesting,
                ),
                "give each dataset and each model a folder of its own under TAU_DATA_DIR with "
                "`path`, none inside another",
            )
            break


INPUTS = ObjectKind(
    (
        Field(
            "datasets",
            AssetListKind("dataset", DatasetInput),
            f"Datasets of your workspace the run reads (at most {MAX_DATASETS}), each mounted "
            "read-only at `TAU_DATA_DIR/<path>`. Aliases are resolved at submission: the run "
            "is pinned to the versions they named then.",
            example="[{name: wiki, version: train}]",
        ),
        Field(
            "models",
            AssetListKind("model", ModelInput),
            f"Models of your workspace the run reads (at most {MAX_MODELS}), as `datasets`: "
            "each mounted read-only at `TAU_DATA_DIR/<path>`, apart from every dataset's "
            "folder, pinned at submission. What the run makes is derived from them too.",
            example="[{name: tiny-gpt, version: production}]",
        ),
    ),
    lambda values: Inputs(**values),
    description="What the run reads besides its project directory: datasets and models of "
    "the workspace.",
    checks=(_check_inputs,),
    aliases={"dataset": "datasets", "data": "datasets", "model": "models"},
)


def _output_asset(kind: str, *, name: str, folder: str) -> ObjectKind[OutputAsset]:
    """``outputs.dataset`` or ``outputs.model``: a folder that becomes a new version."""
    return ObjectKind(
        (
            Field(
                "name",
                _asset_name_kind(kind, name),
                f"The {kind} of your workspace that gets the new version.",
                required=True,
                example=name,
            ),
            Field(
                "path",
                _folder_kind(what=f"{kind} folder", directory="TAU_OUTPUT_DIR", example=folder),
                f"The folder, relative to `TAU_OUTPUT_DIR`, whose files make the {kind} version "
                "(not `TAU_OUTPUT_DIR` itself).",
                required=True,
                example=folder,
            ),
        ),
        lambda values: OutputAsset(**values),
        description=(
            f"A folder under `TAU_OUTPUT_DIR` that becomes a new version of a {kind} when the "
            "run succeeds, derived from the run's input datasets and produced by the run."
        ),
        aliases={"folder": "path", "dir": "path", "directory": "path"},
        expected=f"a {kind} to make ({{name, path}})",
    )


def _check_outputs(block: BlockValues, problems: ProblemCollector) -> None:
    """The dataset's and the model's folders are apart: no file can go into both."""
    if not block.valid("dataset", "model"):
        return
    dataset, model = block.values["dataset"], block.values["model"]
    if dataset is None or model is None:
        return
    nesting = _nesting(model.path, dataset.path)
    if nesting is None:
        return
    where = f"the model's folder {quote(model.path)}"
    message = {
        "same": f"{where} is also the dataset's",
        "inside": f"{where} is inside the dataset's, {quote(dataset.path)}",
        "holds": f"{where} holds the dataset's, {quote(dataset.path)}",
    }[nesting]
    problems.add(
        join_path(block.path_of("model"), "path"),
        _entry(block.nodes.get("model"), "path") or block.where("model"),
        message,
        "give the dataset and the model folders of their own under TAU_OUTPUT_DIR",
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
        Field(
            "dataset",
            _output_asset("dataset", name="wiki-tokenized", folder="tokenized"),
            "A folder under `TAU_OUTPUT_DIR` that becomes a new version of a dataset of your "
            "workspace when the run succeeds, derived from the run's input datasets. "
            "Unset: none.",
            default=None,
            example="{name: wiki-tokenized, path: tokenized}",
        ),
        Field(
            "model",
            _output_asset("model", name="tiny-gpt", folder="model"),
            "A folder under `TAU_OUTPUT_DIR` that becomes a new version of a model of your "
            "workspace when the run succeeds, derived from the run's input datasets. "
            "Unset: none.",
            default=None,
            example="{name: tiny-gpt, path: model}",
        ),
    ),
    lambda values: Outputs(**values),
    description="What the run writes, and what is kept.",
    checks=(_check_outputs,),
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
            "name",
            StringKind(max_length=100, verbatim=True, rule=_label_text_problem),
            "The experiment within the project: runs of one experiment are compared together.",
            default=None,
            example="resnet-baseline",
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
    aliases={"labels": "tags", "experiment": "name"},
)


def _pvc_name_problem(text: str) -> str | None:
    reason = dns1123_subdomain_problem(text)
    return (
        f"{quote(text)} is not a valid PersistentVolumeClaim name: it {reason}" if reason else None
    )


def _check_storage(block: BlockValues, problems: ProblemCollector) -> None:
    if (
        block.valid("data_pvc", "data_access")
        and block.values["data_pvc"] is None
        and "data_access" in block.nodes
    ):
        problems.add(
            block.path_of("data_access"),
            block.where("data_access"),
            "`data_access` is set but there is no `data_pvc`",
            "name the PersistentVolumeClaim to mount in `data_pvc`, or remove `data_access`",
        )


STORAGE = ObjectKind(
    (
        Field(
            "data_pvc",
            StringKind(max_length=253, rule=_pvc_name_problem),
            f"An existing PersistentVolumeClaim in the workspace's namespace, mounted at "
            f"`{Storage.MOUNT_PATH}` in every pod (`TAU_DATA_DIR` names the path). Unset: no "
            "data volume.",
            default=None,
            example="training-data",
        ),
        Field(
            "data_access",
            EnumKind(("read-only", "read-write")),
            "How the data volume is mounted.",
            default="read-only",
            example="read-only",
        ),
    ),
    lambda values: Storage(**values),
    description="A data volume mounted into the run.",
    checks=(_check_storage,),
    aliases={"pvc": "data_pvc", "volume": "data_pvc", "data": "data_pvc", "mode": "data_access"},
)

_PARAMETER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_METRIC_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")


def _metric_problem(text: str) -> str | None:
    if _METRIC_NAME.fullmatch(text):
        return None
    return f"{quote(text)} is not a metric name: use letters, digits, `_`, `.`, `/` and `-`"


class SweepConfigsKind(Kind[tuple[SweepParameter, ...]]):
    """``name: [values…]`` (a grid axis: every value is tried) or ``name: value`` (the same
    for every trial); Ray Tune's own ``{grid_search: [values…]}`` is read as a list."""

    null_is_empty = True
    expected = "a mapping of parameter names to values or lists of values"

    def check_node(
        self, node: Node, path: str, problems: ProblemCollector
    ) -> tuple[SweepParameter, ...] | Invalid:
        if not isinstance(node, MappingNode):
            hint = "write one `name: [values…]` per line, indented below `configs:`"
            return self.type_problem(node, path, problems, hint)
        if len(node.entries) > MAX_SWEEP_PARAMETERS:
            problems.add(
                path,
                node,
                f"has {len(node.entries)} parameters; at most {MAX_SWEEP_PARAMETERS} are allowed",
            )
            return INVALID
        parameters: list[SweepParameter] = []
        failed = False
        for key, value in node.entries:
            parameter_path = join_path(path, key.text)
            if not _PARAMETER_NAME.fullmatch(key.text) or len(key.text) > 64:
                problems.add(
                    parameter_path,
                    key,
                    f"{quote(key.text)} is not a parameter name",
                    "use letters, digits, `_`, `.` and `-` (at most 64), starting with a letter",
                )
                failed = True
                continue
            parameter = self._parameter(key.text, value, parameter_path, problems)
            if parameter is None:
                failed = True
            else:
                parameters.append(parameter)
        if failed:
            return INVALID
        return tuple(sorted(parameters, key=lambda parameter: parameter.name))

    def _parameter(
        self, name: str, node: Node, path: str, problems: ProblemCollector
    ) -> SweepParameter | None:
        if isinstance(node, MappingNode):
            keys = [key.text for key, _value in node.entries]
            if keys == ["grid_search"]:
                return self._grid(
                    name, node.entries[0][1], join_path(path, "grid_search"), problems
                )
            problems.add(
                path,
                node,
                "only lists of values (a grid) are supported: "
                + (f"`{keys[0]}` is not" if keys else "an empty mapping is not"),
                "list the values to try, e.g. `lr: [0.001, 0.01]`",
            )
            return None
        if isinstance(node, SequenceNode):
            return self._grid(name, node, path, problems)
        value = self._value(node, path, problems)
        return None if value is None else SweepParameter(name, (value,), grid=False)

    def _grid(
        self, name: str, node: Node, path: str, problems: ProblemCollector
    ) -> SweepParameter | None:
        if not isinstance(node, SequenceNode) or not node.items:
            problems.add(path, node, "expected a list of at least one value to try")
            return None
        if len(node.items) > MAX_SWEEP_VALUES:
            problems.add(
                path, node, f"has {len(node.items)} values; at most {MAX_SWEEP_VALUES} are allowed"
            )
            return None
        values: list[Any] = []
        for index, item in enumerate(node.items):
            value = self._value(item, index_path(path, index), problems)
            if value is None:
                return None
            seen = [(type(earlier), earlier) for earlier in values]
            if (type(value), value) in seen:
                problems.add(index_path(path, index), item, f"{quote(str(value))} is listed twice")
                return None
            values.append(value)
        return SweepParameter(name, tuple(values), grid=True)

    @staticmethod
    def _value(node: Node, path: str, problems: ProblemCollector) -> Any:
        if not isinstance(node, ScalarNode) or node.kind in ("null", "invalid"):
            if not (isinstance(node, ScalarNode) and node.kind == "invalid"):
                problems.add(
                    path,
                    node,
                    f"expected a value (text, a number or a boolean), got {describe(node)}",
                )
            return None
        if node.kind == "float" and (
            not isinstance(node.value, float)
            or node.value != node.value
            or abs(node.value) == float("inf")
        ):
            problems.add(path, node, f"{quote(node.text)} is not a finite number")
            return None
        if node.kind in ("timestamp",):
            return node.text
        if isinstance(node.value, str) and len(node.value) > 1024:
            problems.add(path, node, "is longer than 1024 characters")
            return None
        return node.value

    def empty(self) -> tuple[SweepParameter, ...]:
        return ()

    def json_schema(self) -> JsonSchema:
        scalar: JsonSchema = {"type": ["string", "number", "boolean"]}
        values: JsonSchema = {
            "type": "array",
            "items": scalar,
            "minItems": 1,
            "maxItems": MAX_SWEEP_VALUES,
        }
        return {
            "type": "object",
            "maxProperties": MAX_SWEEP_PARAMETERS,
            "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_.-]*$", "maxLength": 64},
            "additionalProperties": {
                "anyOf": [
                    scalar,
                    values,
                    {
                        "type": "object",
                        "properties": {"grid_search": values},
                        "required": ["grid_search"],
                        "additionalProperties": False,
                    },
                ]
            },
        }


_SWEEP_ONLY = ("metric", "mode", "num_samples", "max_concurrent_trials", "configs")


def _check_execution(block: BlockValues, problems: ProblemCollector) -> None:
    if not block.valid("launcher"):
        return
    if block.values["launcher"] is None:
        for name in _SWEEP_ONLY:
            if name in block.nodes:
                problems.add(
                    block.path_of(name),
                    block.where(name),
                    f"`{name}` is only used by a sweep",
                    "add `launcher: ray-tune` to run a sweep, or remove it",
                )
        return
    if block.valid("metric") and block.values["metric"] is None:
        problems.add(
            block.path_of("metric"),
            block.node,
            "a sweep needs the `metric` its trials are compared by",
            "add e.g. `metric: val_loss` (a key of the rows the program reports)",
        )
    if block.valid("configs") and not block.values["configs"]:
        problems.add(
            block.path_of("configs"),
            block.where("configs"),
            "a sweep needs the values to try in `configs`",
            "add e.g. `configs: {lr: [0.001, 0.01]}`",
        )
    if block.valid("configs", "num_samples"):
        grid = 1
        for parameter in block.values["configs"]:
            grid *= len(parameter.values)
        trials = grid * block.values["num_samples"]
        if trials > MAX_TRIALS:
            problems.add(
                block.path_of("configs"),
                block.where("configs"),
                f"the sweep has {trials} trials; at most {MAX_TRIALS} are allowed",
                "try fewer values, or split the sweep into several runs",
            )


EXECUTION = ObjectKind(
    (
        Field(
            "launcher",
            EnumKind(("ray-tune",)),
            "`ray-tune`: the run is a sweep, one trial per combination of `configs`. "
            "Unset: the entry point runs once.",
            default=None,
            example="ray-tune",
        ),
        Field(
            "metric",
            StringKind(max_length=128, rule=_metric_problem),
            "The reported metric trials are compared by (sweeps).",
            default=None,
            example="val_loss",
        ),
        Field(
            "mode",
            EnumKind(("min", "max")),
            "Whether the best trial has the lowest (`min`) or highest (`max`) `metric`.",
            default="min",
            example="min",
        ),
        Field(
            "num_samples",
            IntegerKind(1, MAX_TRIALS),
            "How many times the whole grid is tried.",
            default=1,
            example="1",
        ),
        Field(
            "max_concurrent_trials",
            IntegerKind(1, MAX_TRIALS),
            "How many trials run at once, at most.",
            default=1,
            example="2",
        ),
        Field(
            "configs",
            SweepConfigsKind(),
            "Parameter name → list of values to try (a grid axis) or one value for every "
            "trial. Each trial's values reach the program as `TAU_TRIAL_CONFIG` (JSON) and as "
            "the `config` argument of a `train_func(config)` the entry point defines.",
            example="{lr: [0.001, 0.01], batch_size: [32, 64]}",
        ),
    ),
    lambda values: Execution(**values),
    description="How the entry point is launched: once, or as a sweep of trials.",
    checks=(_check_execution,),
    aliases={
        "search": "configs",
        "grid": "configs",
        "param_space": "configs",
        "samples": "num_samples",
    },
)


# ------------------------------------------------------------------------------- endpoints

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_IMPORT_PATH = re.compile(rf"({_IDENTIFIER}(?:\.{_IDENTIFIER})*):({_IDENTIFIER})")
#: Spaces around it are allowed (and stripped), as the checker strips them.
_IMPORT_PATH_PATTERN = rf"^ *{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER} *$"
_IMPORT_PATH_EXAMPLE = "app:deployment"


def _import_path_problem(text: str) -> str | None:
    path = text.strip(" ")
    if not path:
        return "must not be empty"
    match = _IMPORT_PATH.fullmatch(path)
    if match is None:
        return (
            f"{quote(path)} is not an import path: write the module, `:` and the "
            "application's name in it"
        )
    for part in (*match.group(1).split("."), match.group(2)):
        if keyword.iskeyword(part):
            return f"{quote(path)} is not an import path: `{part}` is a Python keyword"
    return None


def _import_path_hint(text: str) -> str:
    path = text.strip(" ")
    module, colon, attribute = path.rpartition(":")
    if not colon:
        module, _dot, attribute = path.rpartition(".")
    module = module.removesuffix(".py").replace("/", ".")
    candidate = f"{module}:{attribute}"
    if candidate != path and _IMPORT_PATH.fullmatch(candidate):
        return f"write `{candidate}`"
    return (
        f"e.g. `{_IMPORT_PATH_EXAMPLE}` for the application `deployment` in `app.py`, "
        "or `pkg.serve:app` in a package"
    )


def _normalise_import_path(text: str) -> str:
    return text.strip(" ")


_WHITESPACE = re.compile(r"\s")


def _route_prefix_problem(text: str) -> str | None:
    if not text.startswith("/"):
        return f"the route prefix {quote(text)} does not start with `/`"
    if _WHITESPACE.search(text):
        return f"the route prefix {quote(text)} contains whitespace"
    for character, what in (("?", "a query"), ("#", "a fragment")):
        if character in text:
            return (
                f"the route prefix {quote(text)} contains `{character}`: it is a path, "
                f"without {what}"
            )
    if "{" in text or "}" in text:
        return f"the route prefix {quote(text)} contains `{{` or `}}`: Ray Serve has no wildcards"
    return hidden_character_problem(text, f"the route prefix {quote(text)}")


def _route_prefix_hint(text: str) -> str:
    if not text.startswith("/") and not _WHITESPACE.search(text):
        return f"write `/{text}`"
    return "write a path such as `/` or `/v1/chat`"


def _normalise_route_prefix(text: str) -> str:
    """``/v1/`` → ``/v1``: Ray Serve takes a trailing ``/`` only on the root."""
    return text.rstrip("/") or "/"


IMPORT_PATH_KIND = StringKind(
    max_length=MAX_IMPORT_PATH_LENGTH,
    rule=_import_path_problem,
    rule_hint=_import_path_hint,
    normalise=_normalise_import_path,
    pattern=_IMPORT_PATH_PATTERN,
    expected="an import path (module:attribute)",
)

ROUTE_PREFIX_KIND = StringKind(
    max_length=MAX_ROUTE_PREFIX_LENGTH,
    rule=_route_prefix_problem,
    rule_hint=_route_prefix_hint,
    normalise=_normalise_route_prefix,
    pattern=r"^/[^\s?#{}]*$",
    expected="a route prefix such as /",
)


def _model_ref_hint(text: str) -> str:
    """For a model written as text (``tiny-gpt@production``): the mapping it should be."""
    name, at, version = text.partition("@")
    if _ASSET_NAME.fullmatch(name) and not at:
        return f"write `{{name: {name}}}`"
    if _ASSET_NAME.fullmatch(name) and _version_problem(version) is None:
        return f"write `{{name: {name}, version: {version}}}`"
    return "write `{name: tiny-gpt, version: production}`"


class ModelRefKind(ObjectKind[ModelRef]):
    """``serve.model``: a mapping; text such as ``tiny-gpt@production`` gets the mapping it
    means as a hint."""

    def check_node(self, node: Node, path: str, problems: ProblemCollector) -> ModelRef | Invalid:
        if isinstance(node, ScalarNode) and node.kind == "str":
            return self.type_problem(node, path, problems, _model_ref_hint(node.text))
        return super().check_node(node, path, problems)

    def json_schema(self) -> JsonSchema:
        return _name_or_from(super().json_schema())


MODEL_REF = ModelRefKind(
    (
        Field(
            "name",
            _asset_name_kind("model", "tiny-gpt"),
            "A model of your workspace (`tau data model list`); the same rules as a dataset's "
            "name. Required, unless `from` names the pipeline stage that makes the model.",
            default=None,
            example="tiny-gpt",
        ),
        Field(
            "from",
            StringKind(
                max_length=STAGE_NAME_MAX_LENGTH,
                rule=_stage_name_problem,
                pattern=STAGE_NAME_PATTERN,
                expected="a stage's name",
            ),
            "In a pipeline's stage (pipeline.yaml): the stage before this one whose run made "
            "the model version to serve, instead of `name` and `version` (`{from: finetune}`). "
            "Resolved when this stage starts, and pinned in the endpoint's record. The stage "
            "must be one this stage needs, and its tau.yaml must have `outputs.model`.",
            default=None,
            example="finetune",
        ),
        Field(
            "version",
            VersionKind("model"),
            "A version number (`3`) or an alias (`production`), resolved when the endpoint is "
            "deployed. Default: `latest`, the newest ready version.",
            default="latest",
            example="production",
        ),
    ),
    lambda values: ModelRef(
        name=values["name"] or "", version=values["version"], from_stage=values["from"]
    ),
    description="A model version of the workspace the endpoint serves, staged read-only at "
    "`TAU_MODEL_DIR`.",
    checks=(_one_source("model", "`serve.model`"),),
    aliases={"model": "name", "alias": "version", "tag": "version"},
    expected="a model version ({name, version})",
)


def _check_autoscaling(block: BlockValues, problems: ProblemCollector) -> None:
    if not block.valid("min_replicas", "max_replicas"):
        return
    low, high = block.values["min_replicas"], block.values["max_replicas"]
    if low > high:
        problems.add(
            block.path_of("min_replicas"),
            block.where("min_replicas"),
            f"`min_replicas` ({low}) is more than `max_replicas` ({high})",
            "the autoscaler keeps between `min_replicas` and `max_replicas` replicas",
        )


AUTOSCALING = ObjectKind(
    (
        Field(
            "min_replicas",
            IntegerKind(0, MAX_REPLICAS),
            "The fewest replicas; `0` lets an idle endpoint scale to zero (its first request "
            "then waits for a replica to start).",
            default=1,
            example="1",
        ),
        Field(
            "max_replicas",
            IntegerKind(1, MAX_REPLICAS),
            "The most replicas, at least `min_replicas`; the quota counts what is running.",
            required=True,
            example="4",
        ),
        Field(
            "target_ongoing_requests",
            IntegerKind(1, MAX_TARGET_ONGOING_REQUESTS),
            "The requests in flight per replica the autoscaler aims at: more add replicas, "
            "fewer remove them.",
            default=2,
            example="2",
        ),
    ),
    lambda values: Autoscaling(**values),
    description="Ray Serve's autoscaling: the number of replicas follows the requests.",
    checks=(_check_autoscaling,),
    aliases={
        "min": "min_replicas",
        "minimum": "min_replicas",
        "max": "max_replicas",
        "maximum": "max_replicas",
        "target": "target_ongoing_requests",
        "target_num_ongoing_requests_per_replica": "target_ongoing_requests",
    },
)


def _check_serve(block: BlockValues, problems: ProblemCollector) -> None:
    if not block.valid("replicas", "autoscaling"):
        return
    if block.values["replicas"] is not None and block.values["autoscaling"] is not None:
        problems.add(
            block.path_of("autoscaling"),
            block.where("autoscaling"),
            "`replicas` and `autoscaling` exclude each other",
            "give a fixed number in `replicas`, or a range in `autoscaling`, not both",
        )


def _build_serve(values: dict[str, Any]) -> Serve:
    replicas = values["replicas"]
    if replicas is None and values["autoscaling"] is None:
        replicas = 1
    return Serve(**{**values, "replicas": replicas})


SERVE = ObjectKind(
    (
        Field(
            "import_path",
            IMPORT_PATH_KIND,
            "The Ray Serve application in the project directory, as `module:attribute` "
            "(`app:deployment` for `deployment` in `app.py`; dots for packages, "
            "`pkg.serve:app`).",
            required=True,
            example=_IMPORT_PATH_EXAMPLE,
        ),
        Field(
            "model",
            MODEL_REF,
            "A model version of your workspace, staged read-only at `TAU_MODEL_DIR` in every "
            "replica. Unset: none.",
            default=None,
            example="{name: tiny-gpt, version: production}",
        ),
        Field(
            "replicas",
            IntegerKind(
                1,
                MAX_REPLICAS,
                too_big_hint="or let `autoscaling` add replicas as requests come",
            ),
            "A fixed number of replicas, each sized by `compute`. Unset: 1, or what "
            "`autoscaling` says.",
            default=None,
            example="2",
        ),
        Field(
            "autoscaling",
            AUTOSCALING,
            "Replicas that follow the requests, instead of a fixed number. Unset: a fixed "
            "number (`replicas`).",
            default=None,
            example="{min_replicas: 1, max_replicas: 4}",
        ),
        Field(
            "route_prefix",
            ROUTE_PREFIX_KIND,
            "The path the application answers under: `/`, or `/v1` and the like (a trailing "
            "`/` is dropped).",
            default="/",
            example="/",
        ),
    ),
    _build_serve,
    description="An endpoint (`run.workload_kind: rayservice`): the Ray Serve application "
    "it runs and how many replicas, each sized by `compute`.",
    checks=(_check_serve,),
    aliases={
        "app": "import_path",
        "application": "import_path",
        "num_replicas": "replicas",
        "autoscaling_config": "autoscaling",
        "route": "route_prefix",
        "prefix": "route_prefix",
        "model_version": "model",
    },
)


def _check_root(block: BlockValues, problems: ProblemCollector) -> None:
    _check_serve_kind(block, problems)
    if not block.valid("run"):
        return
    kind = block.values["run"].workload_kind
    if kind == "rayservice":
        _check_endpoint(block, problems)
    elif kind == "job":
        _check_job(block, problems)


def _check_job(block: BlockValues, problems: ProblemCollector) -> None:
    """What a plain Job cannot have: a Ray head, or a sweep (which needs Ray)."""
    compute = block.values.get("compute")
    if isinstance(compute, Compute) and compute.head is not None:
        compute_node = block.nodes.get("compute")
        where = _entry(compute_node, "head") or block.where("compute")
        problems.add(
            "compute.head",
            where,
            "a Job has no Ray head to size",
            "remove `compute.head`, or set `run.workload_kind: rayjob`",
        )
    execution = block.values.get("execution")
    if isinstance(execution, Execution) and execution.is_sweep:
        execution_node = block.nodes.get("execution")
        where = _entry(execution_node, "launcher") or block.where("execution")
        problems.add(
            "execution.launcher",
            where,
            "a sweep runs Ray Tune, which needs a Ray cluster",
            "set `run.workload_kind: rayjob`",
        )


def _check_serve_kind(block: BlockValues, problems: ProblemCollector) -> None:
    """A ``serve`` block and ``workload_kind: rayservice`` come together."""
    kind_node = _entry(block.nodes.get("run"), "workload_kind")
    if not block.valid("run"):
        # Still said when the run block has problems of its own, if its kind can be read.
        if not (isinstance(kind_node, ScalarNode) and kind_node.text in WORKLOAD_KINDS):
            return
        kind = kind_node.text
    else:
        kind = block.values["run"].workload_kind
    serve_node = block.nodes.get("serve")
    written = serve_node is not None and not is_null(serve_node)
    if kind == "rayservice" and not written:
        problems.add(
            "serve",
            serve_node or block.node,
            "an endpoint (`workload_kind: rayservice`) needs a `serve` block",
            f"add `serve:` with the `import_path` of your Ray Serve application, e.g. "
            f"`{_IMPORT_PATH_EXAMPLE}`",
        )
    elif kind != "rayservice" and written and serve_node is not None:
        problems.add(
            "serve",
            serve_node,
            f"`serve` describes an endpoint, but `run.workload_kind` is `{kind}`",
            "set `run.workload_kind: rayservice`, or remove `serve`",
        )


def _check_endpoint(block: BlockValues, problems: ProblemCollector) -> None:
    """What a ``rayservice`` spec cannot have: it serves requests until it is stopped, with
    ``serve`` replicas each sized by ``compute``, and makes no versions."""
    compute = block.values.get("compute")
    if isinstance(compute, Compute) and compute.workers != 1:
        problems.add(
            "compute.workers",
            _entry(block.nodes.get("compute"), "workers") or block.where("compute"),
            f"an endpoint's `compute` sizes each replica; `workers` must be 1 "
            f"(got {compute.workers})",
            f"use `serve.replicas: {compute.workers}` for {compute.workers} replicas, "
            "or `serve.autoscaling`",
        )
    execution = block.values.get("execution")
    if isinstance(execution, Execution) and execution.is_sweep:
        problems.add(
            "execution.launcher",
            _entry(block.nodes.get("execution"), "launcher") or block.where("execution"),
            "an endpoint serves requests; it runs no sweep",
            "remove `execution`, or set `run.workload_kind: rayjob` to run the sweep",
        )
    outputs = block.values.get("outputs")
    if isinstance(outputs, Outputs):
        for name, asset, hint in (
            ("dataset", outputs.dataset, "a run (`rayjob` or `job`) makes dataset versions"),
            ("model", outputs.model, "`serve.model` names the model version it serves"),
        ):
            if asset is not None:
                problems.add(
                    f"outputs.{name}",
                    _entry(block.nodes.get("outputs"), name) or block.where("outputs"),
                    f"an endpoint makes no {name} versions",
                    f"remove `outputs.{name}`; {hint}",
                )
    inputs = block.values.get("inputs")
    if isinstance(inputs, Inputs) and inputs.models:
        problems.add(
            "inputs.models",
            _entry(block.nodes.get("inputs"), "models") or block.where("inputs"),
            "an endpoint reads the model it serves from `serve.model`, not `inputs.models`",
            "remove `inputs.models`; name the model version in `serve.model`",
        )


def _entry(node: Node | None, name: str) -> Node | None:
    if isinstance(node, MappingNode):
        for key, value in node.entries:
            if key.text == name:
                return value
    return None


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
        Field("inputs", INPUTS, "Datasets and models the run reads, pinned at submission."),
        Field("outputs", OUTPUTS, "What the run writes, and what is kept."),
        Field("experiment", EXPERIMENT, "Labels for comparing runs."),
        Field("storage", STORAGE, "A data volume mounted into the run."),
        Field("execution", EXECUTION, "How the entry point is launched: once, or as a sweep."),
        Field(
            "serve",
            SERVE,
            "The endpoint a `rayservice` is: its Ray Serve application, model version and "
            "replicas. Only with `run.workload_kind: rayservice`.",
            default=None,
            example="{import_path: app:deployment}",
        ),
    ),
    lambda values: Spec(**values),
    description="A TauGrid workload (tau.yaml, schema version 1).",
    checks=(_check_root,),
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


def read_source(source: str | bytes) -> Reading:
    """Load, check and normalise tau.yaml text in any dialect TauGrid reads (its own v1, the
    reference's direct run config or managed manifest): the Spec or every problem, the
    warnings, and how the file was read."""
    problems = ProblemCollector()
    root = load_yaml(source, problems)
    if root is None:
        return Reading("tau", None, problems.sorted())
    dialect, spec, warnings, notes, sources = read_document(root, problems, check_document)
    if problems:
        return Reading(dialect, None, problems.sorted(), warnings, notes, sources)
    return Reading(dialect, spec, [], warnings, notes, sources)


#: What stands in for the rest of a file whose ``compute`` block is read on its own: a Job,
#: which asks for the workers' resources only (a RayJob's head would add to them), so what
#: is found is never more than the whole file would be refused for.
_COMPUTE_ALONE = {
    "schema_version": SCHEMA_VERSION,
    "name": "compute",
    "run": {"entrypoint": "x.py", "workload_kind": "job"},
}


def compute_alone(source: str | bytes) -> Spec | None:
    """A spec of this file's ``compute`` block and nothing else of it (a stand-in name and
    entry point), when the block is valid on its own: what the submit check asks the
    machines and the quota about while the file still has problems elsewhere, so that "this
    can never run here" is said with the typo, not after it is fixed. None for a file that
    cannot be loaded, has no ``compute`` block, or whose block has problems of its own."""
    root = load_yaml(source, ProblemCollector())
    if not isinstance(root, MappingNode):
        return None
    compute = next((value for key, value in root.entries if key.text == "compute"), None)
    if compute is None:
        return None
    stand_in = from_python(_COMPUTE_ALONE)
    assert isinstance(stand_in, MappingNode)
    key = ScalarNode("str", "compute", "compute", True, compute.line, compute.column)
    problems = ProblemCollector()
    spec = check_document(MappingNode((*stand_in.entries, (key, compute)), 0, 0), problems)
    return None if problems or spec is None else spec


def check_source(source: str | bytes) -> tuple[Spec | None, list[SpecProblem]]:
    """Load, check and normalise tau.yaml text: the Spec, or None and every problem."""
    reading = read_source(source)
    return reading.spec, reading.problems


def spec_from_dict(data: Mapping[str, Any]) -> Spec:
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
        "allOf": [_ENDPOINT_OR_RUN],
    }


#: The rules that hang on ``run.workload_kind`` and that JSON Schema can state: an endpoint
#: (``rayservice``) has a ``serve`` block, and none of the keys that need an entry point or
#: make versions; a run has an entry point and no ``serve`` block.
_ENDPOINT_OR_RUN: JsonSchema = {
    "if": {
        "properties": {
            "run": {
                "properties": {"workload_kind": {"const": "rayservice"}},
                "required": ["workload_kind"],
            }
        },
        "required": ["run"],
    },
    "then": {
        "required": ["serve"],
        "properties": {
            "serve": {"type": "object"},
            "run": {
                "properties": {
                    "entrypoint": {"type": "null"},
                    "args": {"maxItems": 0},
                    "max_runtime": {"type": "null"},
                }
            },
            "compute": {"properties": {"workers": {"const": 1}}},
            "execution": {"properties": {"launcher": {"type": "null"}}},
            "outputs": {"properties": {"dataset": {"type": "null"}, "model": {"type": "null"}}},
        },
    },
    "else": {
        "properties": {
            "serve": {"type": "null"},
            "run": {
                "required": ["entrypoint"],
                "properties": {"entrypoint": {"type": "string"}},
            },
        },
    },
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
