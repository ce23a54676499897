"""tau.yaml, schema version 1: load, validate, normalise, hash and describe a workload spec.

The CLI validates offline and the server validates at submission with this same package, so
a file that passes here passes there (workspace policy aside). It is pure Python: no Django,
no network, nothing but PyYAML.

    >>> from tau.spec import load_spec, spec_hash
    >>> spec = load_spec(open("tau.yaml", "rb").read(), filename="tau.yaml")
    >>> spec.compute.memory, spec.runtime.image, spec_hash(spec)[:12]

``load_spec`` raises :class:`SpecError` listing every problem (path, line, column, message,
hint); ``validate`` returns the same problems as a list. ``Spec.to_dict()`` is the normal
form the server stores and ``spec_from_dict()`` reads it back; ``spec_hash`` is the SHA-256
of its canonical JSON. ``json_schema()`` is the JSON Schema for editors and web forms.
The field reference is ``docs/tau-yaml.md``.
"""

from __future__ import annotations

from tau.spec.loader import MAX_DEPTH, MAX_FILE_BYTES, locate
from tau.spec.model import (
    DEFAULT_RETRY_ON,
    FAILURE_CLASSES,
    SCHEMA_VERSION,
    WORKLOAD_KINDS,
    Autoscaling,
    Backoff,
    Compute,
    DatasetInput,
    EnvVar,
    Experiment,
    FailureClass,
    Inputs,
    ModelInput,
    ModelRef,
    NoEntrypoint,
    OutputAsset,
    Outputs,
    Queue,
    Resilience,
    Run,
    Runtime,
    SecretRef,
    Serve,
    Spec,
    WorkloadKind,
    canonical_json,
    spec_hash,
)
from tau.spec.problems import DOCUMENT_PATH, SpecError, SpecProblem
from tau.spec.schema import (
    MAX_NAME_LENGTH,
    MAX_REPLICAS,
    RAYJOB_NAME_MAX_LENGTH,
    RESERVED_ENV_PREFIX,
    RUN_NAME_SUFFIX_MAX_LENGTH,
    check_source,
    json_schema,
    spec_from_dict,
)

__all__ = [
    "DEFAULT_RETRY_ON",
    "DOCUMENT_PATH",
    "FAILURE_CLASSES",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_NAME_LENGTH",
    "MAX_REPLICAS",
    "RAYJOB_NAME_MAX_LENGTH",
    "RESERVED_ENV_PREFIX",
    "RUN_NAME_SUFFIX_MAX_LENGTH",
    "SCHEMA_VERSION",
    "WORKLOAD_KINDS",
    "Autoscaling",
    "Backoff",
    "Compute",
    "DatasetInput",
    "EnvVar",
    "Experiment",
    "FailureClass",
    "Inputs",
    "ModelInput",
    "ModelRef",
    "NoEntrypoint",
    "OutputAsset",
    "Outputs",
    "Queue",
    "Resilience",
    "Run",
    "Runtime",
    "SecretRef",
    "Serve",
    "Spec",
    "SpecError",
    "SpecProblem",
    "WorkloadKind",
    "canonical_json",
    "json_schema",
    "load_spec",
    "locate",
    "spec_from_dict",
    "spec_hash",
    "validate",
]


def load_spec(source: str | bytes, *, filename: str | None = None) -> Spec:
    """The normalised Spec of tau.yaml text (str, or bytes that must be UTF-8).

    Raises :class:`SpecError` with every problem found, whatever the input; no other
    exception escapes for any text or bytes. ``filename`` only labels the error message.
    """
    spec, problems = check_source(source)
    if spec is None:
        raise SpecError(problems, filename=filename)
    return spec


def validate(source: str | bytes) -> list[SpecProblem]:
    """Every problem in tau.yaml text, in file order; an empty list when it is valid."""
    _spec, problems = check_source(source)
    return problems
