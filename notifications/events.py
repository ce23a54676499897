"""The events people are told of, named as the API names them, once.

Webhooks subscribe to a list of these names (an empty list is every event); e-mail
preferences are a list of them too. Validation of either goes through
:func:`unknown_events`, so a misspelt name is refused with the list of the right ones.
"""

from __future__ import annotations

from collections.abc import Iterable

RUN_SUCCEEDED = "run.succeeded"
RUN_FAILED = "run.failed"
RUN_PREEMPTED = "run.preempted"
RUN_CANCELLED = "run.cancelled"
RUN_WAITING = "run.waiting"
BUDGET_THRESHOLD = "budget.threshold"

#: Every event, with what it means (the settings pages and the API schema say this).
EVENTS: dict[str, str] = {
    RUN_SUCCEEDED: "A run finished successfully.",
    RUN_FAILED: "A run failed (with its failure class and a hint).",
    RUN_PREEMPTED: "A run lost its resources to higher-priority work.",
    RUN_CANCELLED: "A run was cancelled by someone other than the person who submitted it.",
    RUN_WAITING: "A run has been waiting for resources longer than the configured minutes.",
    BUDGET_THRESHOLD: "The workspace passed a share (80%, 100%) of its GPU-hour budget.",
}
EVENT_NAMES: tuple[str, ...] = tuple(EVENTS)

#: Events about one run: e-mailed to whoever submitted it.
RUN_EVENTS = frozenset({RUN_SUCCEEDED, RUN_FAILED, RUN_PREEMPTED, RUN_CANCELLED, RUN_WAITING})
#: Events about the workspace as a whole: e-mailed to its admins.
ADMIN_EVENTS = frozenset({BUDGET_THRESHOLD})

#: What a person is e-mailed about until they choose otherwise: their runs finished or
#: failed, and, for a workspace's admins, its budget.
DEFAULT_EMAIL_EVENTS: tuple[str, ...] = (RUN_SUCCEEDED, RUN_FAILED, BUDGET_THRESHOLD)


def unknown_events(names: Iterable[str]) -> list[str]:
    """The names in ``names`` that are no event, in the order given."""
    return [name for name in names if name not in EVENTS]


def unknown_events_message(unknown: list[str]) -> str:
    return (
        f"Unknown event{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}. "
        f"Use any of {', '.join(EVENT_NAMES)}, or an empty list for all of them."
    )


def wants(subscribed: Iterable[str], event: str) -> bool:
    """Whether a webhook subscribed to ``subscribed`` gets ``event`` (empty: everything)."""
    names = list(subscribed)
    return not names or event in names
