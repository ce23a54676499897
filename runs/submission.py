"""Submitting a run: tau.yaml in, a durable pending run out — or every problem at once.

The spec is validated with the same code the CLI uses offline; then the backend says what
its machines could never give the run, workspace policy fills its defaults and applies its
limits, and the code bundle is checked against the spec (the entry point must be in it).
Nothing is written unless all of that passes: a problem that can be seen at submission is
never accepted and left to fail at run time. A spec that describes an endpoint
(``workload_kind: rayservice``) is refused as a whole: endpoints are deployed, not run.

The submit page's live check runs the same functions (``check_spec``, ``check_bundle``)
on every edit, with the listing of the chosen zip that the browser reads.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import IO, TYPE_CHECKING, Any

from django.conf import settings
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers

from portal.rate_limits import window_wait
from runs import budgets, bundles, lifecycle, policy
from runs.backends import RunBackend
from runs.backends.registry import available_backend_names, backend_named
from runs.models import Run
from tau.spec import MAX_FILE_BYTES, locate
from tau.spec.dialects import Reading
from tau.spec.schema import compute_alone, read_source

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from tau.spec import Spec
    from workspaces.models import Workspace

#: The spec package's own limit, checked here before anything reads the text.
MAX_SPEC_BYTES = MAX_FILE_BYTES
#: What a form adds around the files: the tau.yaml text again (the submit page sends the
#: editor's text too), the zip's file listing (up to 5,000 names), field headers.
FORM_OVERHEAD_BYTES = 2 * 2**20
#: The most a submission may declare in ``Content-Length``: a whole bundle, a whole spec and
#: the form. A larger one is refused before any of it is read.
MAX_SUBMISSION_BYTES = bundles.MAX_BUNDLE_BYTES + MAX_SPEC_BYTES + FORM_OVERHEAD_BYTES
#: The same for the submit page's live check, which never sends the zip itself.
MAX_CHECK_BYTES = 2 * MAX_SPEC_BYTES + FORM_OVERHEAD_BYTES
#: Why a valid ``workload_kind: rayservice`` spec is refused here (at ``run.workload_kind``).
ENDPOINT_IS_NOT_A_RUN = "this tau.yaml describes an endpoint; deploy it with `tau serve deploy`"


class Extension:
    """What another app checks and records with every submission, above the run core (the
    catalog: the dataset versions a run reads). ``check(spec, workspace)`` answers the
    problems it finds, as ``(path, message)`` pairs naming tau.yaml keys, and what to record;
    ``record(run, checked)`` runs in the transaction that writes the run, before anything can
    start it (``checked`` is what ``check`` answered), and answers data for the run's
    ``submitted`` event (sealed in its evidence)."""

    def __init__(
        self,
        name: str,
        check: Callable[[Spec, Workspace], tuple[list[tuple[str, str]], Any]],
        record: Callable[..., dict[str, Any]],
    ) -> None:
        self.name = name
        self.check = check
        self.record = record


#: Registered by apps in ``AppConfig.ready()``.
EXTENSIONS: list[Extension] = []


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


class TooManySubmissions(Exception):
    """Submitted too often: nothing was read or submitted; ``wait`` seconds until the next
    submission is taken."""

    def __init__(self, message: str, wait: int) -> None:
        super().__init__(message)
        self.wait = wait


def count_submission(*, user_id: int, token_key: str | None, check: bool = False) -> None:
    """Count one submission (``check``: one live check of the submit page) before any of it
    is read, or raise TooManySubmissions.

    Checking a spec costs real CPU (reading is bounded by ``tau.spec.loader.MAX_NODES``, but
    a script can submit in a loop), so submissions are limited per API token
    (``TAU_SUBMISSIONS_PER_MINUTE``; the pages of one user count as one more token) and per
    user over all their tokens and pages (``TAU_SUBMISSIONS_PER_MINUTE_PER_USER``), so that
    making tokens does not multiply the limit. The submit page's live check has its own,
    higher limit per user (``TAU_SUBMIT_CHECKS_PER_MINUTE``): it runs as people type."""
    if check:
        what, outcome = "checks of a tau.yaml", "nothing was checked"
        limits = [("by you", f"user:{user_id}", settings.TAU_SUBMIT_CHECKS_PER_MINUTE)]
    else:
        what, outcome = "submissions", "this run was not submitted"
        limits = [
            ("with this token", f"token:{token_key}", settings.TAU_SUBMISSIONS_PER_MINUTE)
            if token_key
            else (
                "from the portal's pages",
                f"pages:{user_id}",
                settings.TAU_SUBMISSIONS_PER_MINUTE,
            ),
            ("by you", f"user:{user_id}", settings.TAU_SUBMISSIONS_PER_MINUTE_PER_USER),
        ]
    for how, counted, limit in limits:
        wait = window_wait(f"{'submitcheck' if check else 'submit'}:{counted}", limit, 60)
        if wait is not None:
            raise TooManySubmissions(
                f"More than {limit} {what} a minute {how}; {outcome}. "
                f"Try again in {wait} second{'' if wait == 1 else 's'}.",
                wait,
            )


def _backend(name: str) -> RunBackend | None:
    return backend_named(name) if name in available_backend_names() else None


def _at(source: bytes, path: str, message: str, hint: str | None = None) -> SubmissionProblem:
    """A problem found after the schema, pointed at its line in tau.yaml when it has one.
    ``path`` is a normal-form path; a file in another dialect (the reference CLI's) may say
    the same elsewhere, and the problem is put where the file says it."""
    path = reading_of(source).written_at(path)
    where = locate(source, path)
    line, column = where if where else (None, None)
    return SubmissionProblem(path, message, line=line, column=column, hint=hint)


@functools.lru_cache(maxsize=8)
def reading_of(source: bytes) -> Reading:
    """How tau.yaml text reads (spec or problems, dialect, warnings, where each key was
    written); kept for the few sources a request looks at, so one submission reads once."""
    return read_source(source)


def check_extensions(
    source: bytes, spec: Spec, workspace: Workspace
) -> tuple[list[SubmissionProblem], list[tuple[Extension, Any]]]:
    """What each registered :class:`Extension` refuses in ``spec``, and what each records."""
    problems: list[SubmissionProblem] = []
    checked: list[tuple[Extension, Any]] = []
    for extension in EXTENSIONS:
        found, result = extension.check(spec, workspace)
        problems += [_at(source, path, message) for path, message in found]
        checked.append((extension, result))
    return problems, checked


def check_spec(
    source: bytes, *, workspace: Workspace, backend: str | None = None
) -> policy.Placement:
    """Validate and place a spec without submitting it (the submit page's live check uses
    this). Problems the backend's machines make come first: when none of them could ever
    run it, that is the reason that matters, whatever the workspace's quota says. A file
    with schema problems is still asked about its compute block (``compute_alone``), so
    every problem is said at once."""
    backend = backend or settings.TAU_BACKEND
    if len(source) > MAX_SPEC_BYTES:
        raise SubmissionRefused(
            [SubmissionProblem("spec", f"tau.yaml is larger than {MAX_SPEC_BYTES // 1024} KiB.")]
        )
    # Read once: the problems found after the schema are placed by the same reading.
    reading = reading_of(source)
    if reading.spec is None:
        problems = [
            SubmissionProblem(
                p.path, p.message, line=p.line or None, column=p.column or None, hint=p.hint
            )
            for p in reading.problems
        ]
        # A typo elsewhere is no reason to hide that the run could never start here: the
        # compute block, read on its own, is asked about too (TauGrid's own dialect).
        alone = compute_alone(source) if reading.dialect == "tau" else None
        if alone is not None:
            found, _ = _placed(source, alone, workspace=workspace, backend=backend)
            said = {problem.path for problem in problems}
            problems += [
                problem
                for problem in found
                if problem.path.startswith("compute.") and problem.path not in said
            ]
        raise SubmissionRefused(problems)
    if reading.spec.is_endpoint:
        # Endpoints are not runs: no backend, policy or bundle check of runs is asked about
        # one, and nothing would ever start it as a run.
        raise SubmissionRefused([_at(source, "run.workload_kind", ENDPOINT_IS_NOT_A_RUN)])
    problems, placement = _placed(source, reading.spec, workspace=workspace, backend=backend)
    problems += check_extensions(source, reading.spec, workspace)[0]
    if problems or placement is None:
        raise SubmissionRefused(problems)
    return placement


def _placed(
    source: bytes, spec: Spec, *, workspace: Workspace, backend: str
) -> tuple[list[SubmissionProblem], policy.Placement | None]:
    """What the backend's machines and the workspace's policy refuse in ``spec``, or where it
    is placed. The machines speak first, and a field they refuse is not refused again in
    the quota's words: "more CPUs than this machine has" is the reason, said once."""
    problems: list[SubmissionProblem] = []
    machine_fields: set[str] = set()
    runs_on = _backend(backend)
    if runs_on is not None:
        for path, message in runs_on.submission_problems(spec, workspace):
            problems.append(_at(source, path, message))
            machine_fields.add(path)
    placement = None
    try:
        placement = policy.apply_policy(spec, workspace, backend=backend)
        placement = budgets.apply_budgets(placement, workspace, backend=backend)
    except policy.PolicyRefused as exc:
        # The backend may have said the same (what Kubernetes cannot carry): once is enough.
        said = {(p.path, p.message) for p in problems}
        problems += [
            _at(source, p.path, p.message)
            for p in exc.problems
            if (p.path, p.message) not in said
            and not (p.path.startswith("compute.") and p.path in machine_fields)
        ]
    return problems, placement


def check_bundle(
    spec: Spec,
    listing: bundles.BundleListing | None,
    *,
    source: bytes,
    backend: str | None = None,
) -> tuple[list[SubmissionProblem], str | None]:
    """(problems, the zip's folder to unwrap) for the project zip a spec comes with
    (``listing`` None: no zip). A script entry point must be a file in the zip; when the zip
    holds one folder with everything inside and the script is in that folder, the folder's
    contents are the project (the zip of a project folder, as file managers make it)."""
    script = spec.run.script
    if script is None:
        return [], None  # a command line: what it runs comes from the image or the zip
    path = str(PurePosixPath(script))
    if listing is None:
        runs_on = _backend(backend or settings.TAU_BACKEND)
        if runs_on is not None and runs_on.scripts_need_bundle:
            return [
                _at(
                    source,
                    "run.entrypoint",
                    f"{script} is a file of your project, but no project zip was given: a run "
                    "here starts in a folder holding only the zip's files.",
                    hint=f"add the project zip, with {script} in it",
                )
            ], None
        return [], None
    if path in listing.files:
        return [], None
    if listing.wrapper is not None and f"{listing.wrapper}/{path}" in listing.files:
        return [], listing.wrapper
    elsewhere = listing.similar(path)
    if elsewhere:
        hint = f"the zip has {elsewhere[0]}; set run.entrypoint to {elsewhere[0]}"
        if listing.wrapper is not None and elsewhere[0].startswith(f"{listing.wrapper}/"):
            inner = elsewhere[0][len(listing.wrapper) + 1 :]
            hint = (
                f"the zip has {elsewhere[0]}; its folder {listing.wrapper}/ is unwrapped, so "
                f"set run.entrypoint to {inner}"
            )
    elif listing.files:
        sample = ", ".join(sorted(listing.files)[:5])
        more = f" and {len(listing.files) - 5} more" if len(listing.files) > 5 else ""
        hint = f"the zip holds {sample}{more}"
    else:
        hint = "the zip holds no files"
    return [
        _at(
            source,
            "run.entrypoint",
            f"names {script}, which is not in the project zip.",
            hint=hint,
        )
    ], None


def submit(
    *,
    workspace: Workspace,
    user: User,
    spec_source: bytes,
    bundle: IO[bytes] | None,
    note: Mapping[str, Any] | None = None,
) -> Run:
    """Check a submission whole and write the run (``SubmissionRefused`` with every problem,
    and nothing written, otherwise). ``note``: what the caller records in the run's
    ``submitted`` event besides (a pipeline: its name and the stage the run is)."""
    if settings.TAU_BACKEND not in available_backend_names():
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
    problems: list[SubmissionProblem] = []
    placement = None
    try:
        placement = check_spec(spec_source, workspace=workspace)
    except SubmissionRefused as exc:
        problems += exc.problems
    staged = None
    try:
        if bundle is not None:
            try:
                staged = bundles.stage_upload(bundle)
            except bundles.BundleRejected as exc:
                problems.append(SubmissionProblem("bundle", str(exc)))
        unwrap = None
        if placement is not None and (bundle is None or staged is not None):
            found, unwrap = check_bundle(
                placement.spec, staged.listing if staged else None, source=spec_source
            )
            problems += found
        if problems or placement is None:
            raise SubmissionRefused(problems)
        # Checked again for what to record: an alias moved since is pinned as it is now.
        problems, checked = check_extensions(spec_source, placement.spec, workspace)
        if problems:
            raise SubmissionRefused(problems)
        stored = bundles.keep(staged, workspace=workspace, unwrap=unwrap) if staged else None
    finally:
        if staged is not None:
            bundles.discard(staged)
    return lifecycle.create_run(
        workspace=workspace,
        user=user,
        submission=lifecycle.Submission(
            spec=placement.spec,
            source=spec_source.decode("utf-8"),
            bundle=stored,
            priority=placement.priority,
            priority_value=placement.priority_value,
            backend=settings.TAU_BACKEND,
            unwrapped_folder=unwrap,
            cost=placement.cost.to_dict() if placement.cost else None,
            extensions=(
                *(
                    functools.partial(extension.record, checked=result)
                    for extension, result in checked
                ),
                *([lambda run: dict(note)] if note else []),
            ),
        ),
    )


# --- Request size ---------------------------------------------------------------------------

#: Routes that take a submission (or the live check's), and the most each may declare
#: (also refused by make run's server before a byte is read: web.asgi).
SIZED_ROUTES: dict[str, int] = {
    "api:run-list": MAX_SUBMISSION_BYTES,
    "run-submit": MAX_SUBMISSION_BYTES,
    "run-validate": MAX_CHECK_BYTES,
}


def too_large_problem(declared: int) -> SubmissionProblem:
    """The one message for a submission too large to be read, on the API and the page."""
    return SubmissionProblem(
        "bundle",
        f"The upload is {declared / 2**20:.1f} MiB; a submission may be at most "
        f"{MAX_SUBMISSION_BYTES / 2**20:.1f} MiB (a project zip of up to "
        f"{bundles.MAX_BUNDLE_BYTES // 2**20} MiB, a tau.yaml of up to "
        f"{MAX_SPEC_BYTES // 1024} KiB). Nothing was read or kept.",
    )


class SubmissionSizeMiddleware:
    """Refuses a submission from its declared size (``Content-Length``) before any of it is
    read: neither Django, which parses the whole form before any view runs (the CSRF check
    reads it), nor the API reads a byte of an upload that could never be accepted. Listed
    before ``CsrfViewMiddleware``, so that its ``process_view`` runs first.

    The answer is the same problem on both roads: the API's 413 with the ``problems`` list
    of any refused submission; on the submit page a 400 that the page shows where its check
    is (htmx swaps a 400 in), or a 413 with the same text without JavaScript. Uploads that
    declare less are still cut at the bundle limit as they are read (BoundedUploadHandler).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any
    ) -> HttpResponseBase | None:
        match = request.resolver_match
        limit = SIZED_ROUTES.get(match.view_name) if match is not None else None
        if limit is None or request.method != "POST":
            return None
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared <= limit:
            return None
        problem = too_large_problem(declared)
        if match is not None and match.view_name.startswith("api:"):
            return JsonResponse(
                {"detail": "The run was not submitted.", "problems": [problem.to_dict()]},
                status=413,
            )
        htmx = request.headers.get("HX-Request") == "true"
        response = render(
            request,
            "runs/submit.html#validation",
            {"problems": [problem], "refused": True},
            status=400 if htmx else 413,
        )
        patch_vary_headers(response, ["HX-Request"])
        return response
