"""Submitting a run: tau.yaml in, a durable pending run out — or every problem at once.

The spec is validated with the same code the CLI uses offline, then workspace policy fills
its defaults and applies its limits, then the code bundle is checked and stored. Nothing is
written unless all of that passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from django.conf import settings

from runs import bundles, policy, services
from runs.backends import AVAILABLE_BACKENDS
from runs.models import Run
from tau.spec import SpecError, load_spec

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from workspaces.models import Workspace

MAX_SPEC_BYTES = 256 * 1024


@dataclass(frozen=True)
class SubmissionProblem:
    path: str
    message: str
    line: int | None = None
    column: int | None = None
    hint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "message": self.message,
            "hint": self.hint,
        }


class SubmissionRefused(ValueError):
    def __init__(self, problems: list[SubmissionProblem]) -> None:
        super().__init__("; ".join(f"{p.path}: {p.message}" for p in problems))
        self.problems = problems


def check_spec(source: bytes, *, workspace: Workspace) -> policy.Placement:
    """Validate and place a spec without submitting it (the submit page's preview uses this)."""
    if len(source) > MAX_SPEC_BYTES:
        raise SubmissionRefused(
            [SubmissionProblem("spec", f"tau.yaml is larger than {MAX_SPEC_BYTES // 1024} KiB.")]
        )
    try:
        spec = load_spec(source, filename="tau.yaml")
    except SpecError as exc:
        raise SubmissionRefused(
            [
                SubmissionProblem(
                    p.path, p.message, line=p.line or None, column=p.column or None, hint=p.hint
                )
                for p in exc.errors
            ]
        ) from None
    try:
        return policy.apply_policy(spec, workspace, backend=settings.TAU_BACKEND)
    except policy.PolicyRefused as exc:
        raise SubmissionRefused(
            [SubmissionProblem(p.path, p.message) for p in exc.problems]
        ) from None


def submit(
    *, workspace: Workspace, user: User, spec_source: bytes, bundle: IO[bytes] | None
) -> Run:
    if settings.TAU_BACKEND not in AVAILABLE_BACKENDS:
        # Refuse now rather than accept a run that no backend will ever take.
        raise SubmissionRefused(
            [
                SubmissionProblem(
                    "backend",
                    f"this installation runs the {settings.TAU_BACKEND} backend, which cannot "
                    "take runs yet; ask the platform team (TAU_BACKEND=local runs them here).",
                )
            ]
        )
    placement = check_spec(spec_source, workspace=workspace)
    stored = None
    if bundle is not None:
        try:
            stored = bundles.store_upload(workspace=workspace, upload=bundle)
        except bundles.BundleRejected as exc:
            raise SubmissionRefused([SubmissionProblem("bundle", str(exc))]) from None
    return services.create_run(
        workspace=workspace,
        user=user,
        submission=services.Submission(
            spec=placement.spec,
            source=spec_source.decode("utf-8"),
            bundle=stored,
            priority=placement.priority,
            priority_value=placement.priority_value,
            backend=settings.TAU_BACKEND,
        ),
    )
