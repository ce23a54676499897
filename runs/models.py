"""Runs: one row per submitted workload, its attempts, its append-only event history, the
delivery records that make every hand-over to a backend durable, and what the workload
reports (metric points, checkpoints).

A run's state lives in ``Run.state`` and is changed only by ``runs.state.transition``,
which checks the transition table below and writes a :class:`RunEvent` in the same
transaction. Events form a hash chain per run (each stores the hash of the one before), so
the history can be verified and, later, sealed into the run's evidence.

The named sets of states (waiting, running, live, terminal) and the event kinds are defined
here, once; pages, the API, usage and the agent use them instead of lists of their own.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass
from typing import Any, ClassVar

from django.conf import settings
from django.db import models
from django.utils import timezone

from portal.tenancy import TenantModel


class RunState(models.TextChoices):
    PENDING = "pending", "Pending"  # accepted, not yet handed to the backend
    QUEUED = "queued", "Queued"  # waiting for admission
    ADMITTED = "admitted", "Admitted"  # has resources, starting
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLING = "cancelling", "Cancelling"
    CANCELLED = "cancelled", "Cancelled"
    PREEMPTED = "preempted", "Preempted"  # lost its resources to higher priority work
    EVICTED = "evicted", "Evicted"  # removed by the platform (node failure, timeout)


#: Waiting for resources: not yet handed over, in the queue, or put back by the platform
#: (under Kueue a preempted or evicted workload waits to be admitted again).
WAITING_STATES = frozenset(
    {RunState.PENDING, RunState.QUEUED, RunState.PREEMPTED, RunState.EVICTED}
)
#: Holding resources: admitted, running, or being stopped.
RUNNING_STATES = frozenset({RunState.ADMITTED, RunState.RUNNING, RunState.CANCELLING})
#: Finished: nothing more happens unless someone resumes it.
TERMINAL_STATES = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})
#: Not finished: waiting or running.
LIVE_STATES = WAITING_STATES | RUNNING_STATES

# Which state may follow which. Anything else is a bug and raises IllegalTransition.
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.PENDING: frozenset({RunState.QUEUED, RunState.CANCELLED, RunState.FAILED}),
    RunState.QUEUED: frozenset(
        {RunState.ADMITTED, RunState.CANCELLING, RunState.CANCELLED, RunState.FAILED}
    ),
    RunState.ADMITTED: frozenset(
        {
            RunState.RUNNING,
            RunState.QUEUED,  # admission withdrawn before it started
            RunState.PREEMPTED,
            RunState.EVICTED,
            RunState.CANCELLING,
            RunState.FAILED,
        }
    ),
    RunState.RUNNING: frozenset(
        {
            RunState.SUCCEEDED,
            RunState.FAILED,
            RunState.CANCELLING,
            RunState.PREEMPTED,
            RunState.EVICTED,
            RunState.QUEUED,  # the attempt failed and a retry is due
        }
    ),
    RunState.PREEMPTED: frozenset({RunState.QUEUED, RunState.FAILED, RunState.CANCELLED}),
    RunState.EVICTED: frozenset({RunState.QUEUED, RunState.FAILED, RunState.CANCELLED}),
    # A workload can still finish on its own while it is being stopped.
    RunState.CANCELLING: frozenset({RunState.CANCELLED, RunState.SUCCEEDED, RunState.FAILED}),
    # Finished runs can be resumed (a new attempt, from a checkpoint).
    RunState.SUCCEEDED: frozenset({RunState.QUEUED}),
    RunState.FAILED: frozenset({RunState.QUEUED}),
    RunState.CANCELLED: frozenset({RunState.QUEUED}),
}


class EventKind(enum.StrEnum):
    """What an event of a run's history records. A workload's own events are
    ``workload.<its kind>`` (:data:`WORKLOAD_EVENT_PREFIX`), the only kinds not listed here."""

    SUBMITTED = "submitted"
    STATE = "state"  # a plain change of state
    CANCEL_REQUESTED = "cancel-requested"
    CANCELLED = "cancelled"
    RESUMED = "resumed"
    RETRY = "retry"
    METRICS_SKIPPED = "metrics-skipped"
    DELIVERY_FAILED = "delivery-failed"  # the backend could not be told, and TauGrid gave up
    ARTIFACT_REFUSED = "artifact-refused"  # a declared file was not kept (a limit, its name)
    OUTPUTS_KEPT = "outputs-kept"  # outputs.dataset / outputs.model became versions (catalog)
    DATA_STAGED = "data-staged"  # an attempt's inputs.datasets are in place (files, bytes, s)


WORKLOAD_EVENT_PREFIX = "workload."


class FailureClass(models.TextChoices):
    USER_ERROR = "user_error", "Exited with an error"
    OOM_KILLED = "oom_killed", "Out of memory"
    PREEMPTED = "preempted", "Preempted"
    EVICTED = "evicted", "Evicted"
    NODE_FAILURE = "node_failure", "Node or GPU failure"
    DEADLINE_EXCEEDED = "deadline_exceeded", "Ran out of time"
    INFRASTRUCTURE = "infrastructure", "Could not start"
    UNKNOWN = "unknown", "Unknown"


@dataclass(frozen=True)
class FailureHint:
    """What to tell the user about a failed attempt, in two versions: when its log has
    output (the log is then where to look) and when the log is empty (pointing at the log
    would send them nowhere). ``{ended}`` is filled in with how it ended ("It exited with
    code 1", "It was stopped by SIGTERM (exit code 143)"), from its exit code."""

    with_log: str
    without_log: str


FAILURE_HINTS: dict[str, FailureHint] = {
    FailureClass.USER_ERROR: FailureHint(
        with_log="{ended}; the end of its log usually says why.",
        without_log="{ended} before writing anything to its log; run the entrypoint on your "
        "machine to see why.",
    ),
    FailureClass.OOM_KILLED: FailureHint(
        with_log="It used more memory than it was given and was stopped; the log shows how "
        "far it got. Ask for more `compute.memory` or use smaller batches.",
        without_log="It used more memory than it was given and was stopped before writing "
        "anything to its log, so probably while loading; ask for more `compute.memory`.",
    ),
    FailureClass.PREEMPTED: FailureHint(
        with_log="Higher-priority work needed its resources; nothing is wrong with the "
        "program, and a retry resumes from its newest checkpoint, if it wrote one.",
        without_log="Higher-priority work needed its resources before it had written "
        "anything; nothing is wrong with the program, and a retry starts it again.",
    ),
    FailureClass.EVICTED: FailureHint(
        with_log="The platform removed it (node drained or unhealthy), not the program; "
        "retrying usually works, from its newest checkpoint if it wrote one.",
        without_log="The platform removed it (node drained or unhealthy) before it had "
        "written anything; retrying usually works.",
    ),
    FailureClass.NODE_FAILURE: FailureHint(
        with_log="The machine or one of its GPUs failed under it (the node stopped answering, "
        "or the GPU driver reported an XID error such as a GPU that fell off the bus), not "
        "the program; node failures are retried by default (`resilience.retry_on`), and the "
        "log shows how far it got.",
        without_log="The machine or one of its GPUs failed (the node stopped answering, or "
        "the GPU driver reported an XID error such as a GPU that fell off the bus) before it "
        "had written anything, not the program; node failures are retried by default "
        "(`resilience.retry_on`).",
    ),
    FailureClass.DEADLINE_EXCEEDED: FailureHint(
        with_log="It ran longer than `run.max_runtime` allows and was stopped; the log shows "
        "how far it got. Raise the limit or checkpoint more often.",
        without_log="It ran for all of `run.max_runtime` without writing anything to its "
        "log; check that it is not waiting for something (data, a network address, a lock) "
        "before raising the limit.",
    ),
    FailureClass.INFRASTRUCTURE: FailureHint(
        with_log="TauGrid could not start or keep it running (environment, image or "
        "dependencies); its log shows which step failed.",
        without_log="TauGrid could not start or keep it running (environment, image or "
        "dependencies), and nothing reached its log; {message_or_team}",
    ),
    FailureClass.UNKNOWN: FailureHint(
        with_log="It stopped for a reason TauGrid could not determine; the end of its log "
        "may say why.",
        without_log="It stopped for a reason TauGrid could not determine, before writing "
        "anything to its log; {message_or_team}",
    ),
}


def _how_it_ended(exit_code: int | None) -> str:
    """How a program ended, from its exit code (128 + N when signal N ended it)."""
    if exit_code is None:
        return "It stopped with an error"
    if 128 < exit_code < 128 + signal.NSIG:
        try:
            name = signal.Signals(exit_code - 128).name
        except ValueError:
            name = f"signal {exit_code - 128}"
        return f"It was stopped by {name} (exit code {exit_code})"
    return f"It exited with code {exit_code}"


def failure_hint_for(
    failure_class: str, *, log_size: int, exit_code: int | None, failure_message: str
) -> str:
    """The hint for a failed attempt, fitted to what happened: whether anything reached its
    log, how it exited, and whether a failure message says more."""
    hint = FAILURE_HINTS.get(failure_class)
    if hint is None:
        return ""
    text = hint.with_log if log_size > 0 else hint.without_log
    return text.format(
        ended=_how_it_ended(exit_code),
        message_or_team="the message with it says what failed."
        if failure_message.strip()
        else "the platform team can find out why in TauGrid's own logs.",
    )


class Backend(models.TextChoices):
    LOCAL = "local", "This machine"
    KUBERNETES = "kubernetes", "Kubernetes"


class CodeBundle(TenantModel):
    """A project directory as submitted: a zip stored once per content (SHA-256)."""

    workspace = models.ForeignKey(
        "workspaces.Workspace", on_delete=models.PROTECT, related_name="+"
    )
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    file_count = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta(TenantModel.Meta):
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "sha256"], name="bundle_unique_per_workspace"
            )
        ]

    def __str__(self) -> str:
        return f"bundle {self.sha256[:12]} ({self.file_count} files)"


class Run(TenantModel):
    workspace = models.ForeignKey(
        "workspaces.Workspace", on_delete=models.PROTECT, related_name="runs"
    )
    name = models.CharField(max_length=63, help_text="The spec name plus a short unique suffix.")
    spec_name = models.CharField(max_length=63)
    spec = models.JSONField(help_text="The normalised tau.yaml, with workspace defaults applied.")
    spec_hash = models.CharField(max_length=64)
    spec_source = models.TextField(help_text="The tau.yaml exactly as submitted.")
    # The spec's experiment labels, as columns: the runs list groups and filters by them.
    experiment_project = models.CharField(max_length=100, blank=True, default="")
    experiment_name = models.CharField(max_length=100, blank=True, default="")
    experiment_group = models.CharField(max_length=100, blank=True, default="")
    bundle = models.ForeignKey(
        CodeBundle, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    submitted_by_username = models.CharField(max_length=150)
    backend = models.CharField(max_length=20, choices=Backend.choices)
    priority = models.CharField(max_length=253, blank=True)
    priority_value = models.IntegerField(default=0, help_text="Higher runs first.")

    state = models.CharField(max_length=20, choices=RunState.choices, default=RunState.PENDING)
    state_reason = models.TextField(blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    attempt_count = models.PositiveIntegerField(default=0)
    failure_class = models.CharField(max_length=30, choices=FailureClass.choices, blank=True)

    created_at = models.DateTimeField(default=timezone.now)
    queued_at = models.DateTimeField(null=True, blank=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # The next attempt may not start before this (retry backoff).
    not_before = models.DateTimeField(null=True, blank=True)
    # What the next attempt starts from, and why it is happening.
    resume_from = models.ForeignKey(
        "Checkpoint", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    retry_reason = models.CharField(max_length=30, blank=True)

    #: Set by submission on the run it has just created (not a column: the submitted event
    #: keeps it): what the run may cost in GPU-hours, for the submitter's answer.
    submitted_cost: dict[str, Any] | None = None

    class Meta(TenantModel.Meta):
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "name"], name="run_unique_name_per_workspace"
            )
        ]
        indexes = [
            models.Index(fields=["workspace", "-created_at", "-id"], name="run_list"),
            models.Index(fields=["workspace", "state", "-created_at"], name="run_state_list"),
            models.Index(fields=["workspace", "spec_name", "-created_at"], name="run_spec_name"),
            models.Index(
                fields=["workspace", "experiment_project", "experiment_name", "-created_at"],
                name="run_experiment",
            ),
            models.Index(fields=["backend", "state"], name="run_backend_state"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_STATES


class RunAttempt(TenantModel):
    """One execution of a run: the first try, a retry, or a resume.

    An attempt exists, numbered, from the moment the run is handed to its backend (in the
    same transaction as the change that needs it: submission, a retry, a resume), waiting;
    the backend admits it, starts it, and reports how it ended."""

    tenant_path: ClassVar[str | None] = "run__workspace"

    class State(models.TextChoices):
        WAITING = "waiting", "Waiting"  # handed to the backend, not admitted yet
        STARTING = "starting", "Starting"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    state = models.CharField(max_length=20, choices=State.choices, default=State.WAITING)
    backend_name = models.CharField(max_length=253, blank=True, help_text="Object or process name.")
    pid = models.IntegerField(null=True, blank=True)
    process_start_ticks = models.BigIntegerField(
        null=True, blank=True, help_text="Start time of the process, to tell it from a reused pid."
    )
    exit_code = models.IntegerField(null=True, blank=True)
    failure_class = models.CharField(max_length=30, choices=FailureClass.choices, blank=True)
    failure_message = models.TextField(blank=True)
    counts_against_retries = models.BooleanField(
        default=True, help_text="False when the platform, not the workload, ended it."
    )
    resume_from = models.ForeignKey(
        "Checkpoint", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    retry_reason = models.CharField(max_length=30, blank=True)
    # The token the attempt's workload reports with (``TAU_RUN_TOKEN``): it reaches this run
    # only, and is revoked when the attempt ends (runs.run_tokens).
    token = models.OneToOneField(
        "identity.ApiToken", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    log_path = models.CharField(max_length=500, blank=True)
    log_size = models.PositiveBigIntegerField(default=0)
    # Why an ended attempt has no kept log, when its backend looked and found none to keep (a
    # cluster attempt whose pods were gone, or never started): the evidence records it
    # instead of waiting for a log that will not come.
    log_note = models.CharField(max_length=500, blank=True)
    metrics_offset = models.PositiveBigIntegerField(
        default=0, help_text="Bytes of the metrics file read."
    )
    # Where a cluster placed the attempt (empty on the local backend): what Kueue admitted
    # it to and the nodes its pods ran on, as the watcher saw them.
    cluster_queue = models.CharField(max_length=253, blank=True)
    flavors = models.JSONField(
        default=dict, blank=True, help_text='Flavor per resource, e.g. {"nvidia.com/gpu": "h100"}.'
    )
    node_names = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # When it got its resources (Kueue's admission on a cluster, the local agent's on one
    # machine): what it used is counted from here to finished_at (runs.accounting).
    admitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta(TenantModel.Meta):
        ordering = ["run", "number"]
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="attempt_unique_number")
        ]
        indexes = [
            # Usage of a period: the attempts that held resources in it.
            models.Index(fields=["admitted_at"], name="attempt_admitted"),
        ]

    def __str__(self) -> str:
        return f"{self.run.name} attempt {self.number}"

    @property
    def failure_hint(self) -> str:
        return failure_hint_for(
            self.failure_class,
            log_size=self.log_size,
            exit_code=self.exit_code,
            failure_message=self.failure_message,
        )


class RunEvent(TenantModel):
    """Append-only history of a run. ``hash`` = SHA-256 over the previous event's hash and
    this event's canonical content, so any change to the history breaks the chain."""

    tenant_path: ClassVar[str | None] = "run__workspace"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    time = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=40)
    old_state = models.CharField(max_length=20, blank=True)
    new_state = models.CharField(max_length=20, blank=True)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta(TenantModel.Meta):
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="event_unique_seq")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.kind}"


class Delivery(TenantModel):
    """Outbox: an instruction for the backend, written in the same transaction as the change
    that needs it, and retried (with backoff, a bounded number of times) until the backend
    has it (``runs.delivery``).

    ``submit`` hands the backend the run's attempt ``attempt`` (a first submission, a retry,
    a resume); ``cancel`` tells it to stop the run. A delivery is *claimed* (``claimed_at``)
    for the time of one backend call, made outside any database transaction; it ends
    ``delivered_at`` or, when the backend kept failing, ``given_up_at``."""

    tenant_path: ClassVar[str | None] = "run__workspace"

    class Action(models.TextChoices):
        SUBMIT = "submit", "Submit"
        CANCEL = "cancel", "Cancel"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="deliveries")
    action = models.CharField(max_length=20, choices=Action.choices)
    attempt = models.ForeignKey(
        RunAttempt, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    tries = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    next_try_at = models.DateTimeField(default=timezone.now)
    claimed_at = models.DateTimeField(null=True, blank=True)
    given_up_at = models.DateTimeField(null=True, blank=True)

    class Meta(TenantModel.Meta):
        indexes = [
            models.Index(
                fields=["next_try_at"],
                name="delivery_due",
                condition=models.Q(delivered_at__isnull=True, given_up_at__isnull=True),
            )
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.run_id}"


class MetricPoint(TenantModel):
    """One value of one metric at one step, as the workload reported it."""

    tenant_path: ClassVar[str | None] = "run__workspace"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_points")
    attempt = models.PositiveIntegerField()
    key = models.CharField(max_length=100)
    step = models.BigIntegerField()
    value = models.FloatField()
    time = models.DateTimeField(default=timezone.now)

    class Meta(TenantModel.Meta):
        indexes = [models.Index(fields=["run", "key", "step"], name="metric_series")]


class Checkpoint(TenantModel):
    """A checkpoint the workload wrote (a folder or file per step) or registered."""

    tenant_path: ClassVar[str | None] = "run__workspace"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    attempt = models.PositiveIntegerField()
    step = models.BigIntegerField()
    path = models.CharField(max_length=1000, help_text="Where it is, as the backend sees it.")
    complete = models.BooleanField(default=True)
    size = models.PositiveBigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    data: Any = models.JSONField(default=dict, blank=True)

    class Meta(TenantModel.Meta):
        ordering = ["run", "-step"]
        constraints = [
            models.UniqueConstraint(fields=["run", "path"], name="checkpoint_unique_path")
        ]

    def __str__(self) -> str:
        return f"step {self.step}"


class RunTrial(TenantModel):
    """One trial of a sweep (``execution.launcher: ray-tune``): its values and how it went, as
    the attempt's sweep runner reports them (``runs.trials``). Its metrics are the run's
    points named ``trial-<number>/<key>``."""

    tenant_path: ClassVar[str | None] = "run__workspace"

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="trials")
    attempt = models.PositiveIntegerField()
    number = models.PositiveIntegerField()
    config: Any = models.JSONField(default=dict)
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    exit_code = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta(TenantModel.Meta):
        ordering = ["run", "attempt", "number"]
        constraints = [
            models.UniqueConstraint(fields=["run", "attempt", "number"], name="trial_unique_number")
        ]

    def __str__(self) -> str:
        return f"trial {self.number}"


class Artifact(TenantModel):
    """A file the run declared in ``outputs.artifacts`` and TauGrid keeps (``runs.artifacts``).

    One row per path per run: the evidence record lists artifacts by path
    (``artifacts/<path>``), so when a later attempt writes the same path again its file
    replaces the earlier one and ``attempt`` says which attempt wrote what is kept. The
    content is stored once per SHA-256 under ``VAR_DIR/artifacts/``; ``path`` is only a
    name (a normalised relative POSIX path), never used to find the bytes on disk."""

    tenant_path: ClassVar[str | None] = "run__workspace"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts")
    attempt = models.PositiveIntegerField()
    path = models.CharField(max_length=1000, help_text="Relative to the run's output folder.")
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta(TenantModel.Meta):
        ordering = ["run", "path"]
        constraints = [models.UniqueConstraint(fields=["run", "path"], name="artifact_unique_path")]

    def __str__(self) -> str:
        return self.path
