"""The embedded backend: runs execute as processes on this machine, supervised by the local
agent (``manage.py run_agent``), which admits queued runs within the machine's resources."""

from __future__ import annotations

from runs.agent import admission
from runs.models import Run, RunState
from runs.policy import requested_totals
from runs.services import lock_run, transition
from tau.quantity import QuantityError
from tau.spec import Spec
from workspaces.models import GPU_RESOURCE

#: The tau.yaml field each resource of the machine is asked for in.
FIELD_OF = {
    admission.CPU: "compute.cpus",
    admission.MEMORY: "compute.memory",
    GPU_RESOURCE: "compute.gpus",
}


class LocalBackend:
    name = "local"
    #: A run starts in a folder holding its project zip and nothing else: a script entry
    #: point needs a zip that has it (a cluster run may find it in its image instead).
    scripts_need_bundle = True

    def submission_problems(self, spec: Spec) -> list[tuple[str, str]]:
        """(tau.yaml path, message) for what this machine could never give the run, however
        idle it is: such a run is refused up front instead of waiting forever."""
        try:
            capacity = admission.machine_capacity()
        except (QuantityError, OSError, RuntimeError):
            return []  # a broken TAU_LOCAL_MEMORY stops the agent, which says so at start
        never = admission.never_fits(requested_totals(spec), capacity)
        return [(FIELD_OF[resource], message) for resource, message in never.items()]

    def submit(self, run: Run) -> None:
        locked = lock_run(run.pk)
        if locked.state == RunState.PENDING:
            transition(locked, RunState.QUEUED, reason="Waiting for the local agent to admit it.")

    def cancel(self, run: Run) -> None:
        # The agent stops the process group of any run in state "cancelling"; a run that was
        # not executing has already been moved to "cancelled" by the cancel itself.
        return None
