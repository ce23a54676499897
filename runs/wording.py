"""The words people read for a run's codes: states, event kinds, retry reasons; and for
its times: how long it ran, when it may start (``duration_words``).

The codes (``cancel-requested``, ``manual_resume``, ``oom_killed``) are what the database,
the API and the event chain keep; pages show the words below instead, and nowhere else
defines them. ``tests/runs/test_wording.py`` walks every state, every event kind
(``runs.models.EventKind``) and every retry reason, so a new code without words fails there
rather than reaching a page.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from runs.models import WORKLOAD_EVENT_PREFIX, EventKind, FailureClass, RunState

# Badges and timeline: the state's own label, so a state reads the same everywhere.
STATE_WORDS: dict[str, str] = {state.value: state.label for state in RunState}

# What happened, for the timeline. "state" is a plain change of state: the state says it.
EVENT_WORDS: dict[str, str] = {
    EventKind.SUBMITTED: "Submitted",
    EventKind.STATE: "",
    EventKind.CANCEL_REQUESTED: "Cancel requested",
    EventKind.CANCELLED: "Cancelled",
    EventKind.RESUMED: "Resumed",
    EventKind.RETRY: "Starting again",
    EventKind.METRICS_SKIPPED: "Some metric lines could not be read",
    EventKind.DELIVERY_FAILED: "The backend could not be reached",
    EventKind.ARTIFACT_REFUSED: "A declared artifact was not kept",
    EventKind.OUTPUTS_KEPT: "Its outputs were kept as new versions",
    EventKind.DATA_STAGED: "Its datasets were staged",
}

# Event kinds whose words already say the state they lead to: the state is not repeated
# ("Cancelled", not "Cancelled → Cancelled").
_STATE_SAID_BY_EVENT: dict[str, str] = {
    EventKind.SUBMITTED: RunState.PENDING,
    EventKind.CANCEL_REQUESTED: RunState.CANCELLING,
    EventKind.CANCELLED: RunState.CANCELLED,
}

MANUAL_RESUME = "manual_resume"

# Why an attempt was started, after "Attempt 3": the first attempt has no reason.
RETRY_REASON_WORDS: dict[str, str] = {
    MANUAL_RESUME: "resumed on request",
    FailureClass.USER_ERROR: "retry after the program exited with an error",
    FailureClass.OOM_KILLED: "retry after it ran out of memory",
    FailureClass.PREEMPTED: "retry after higher-priority work took its resources",
    FailureClass.EVICTED: "retry after the platform removed it",
    FailureClass.NODE_FAILURE: "retry after a machine or GPU failed under it",
    FailureClass.DEADLINE_EXCEEDED: "retry after it ran out of time",
    FailureClass.INFRASTRUCTURE: "started again after a platform problem",
    FailureClass.UNKNOWN: "retry after it stopped for an unknown reason",
}


def _plain(code: str) -> str:
    """A code nobody wrote words for yet, at least without its underscores and dashes."""
    return " ".join(code.replace("_", " ").replace("-", " ").replace(".", " ").split())


def state_words(state: str) -> str:
    return STATE_WORDS.get(state) or _plain(state).capitalize()


@dataclass(frozen=True)
class EventWords:
    """One timeline entry: what happened, and the state it led to when that adds anything."""

    headline: str
    state: str  # the new state's words, or "" when the headline already says it


def event_words(kind: str, new_state: str = "") -> EventWords:
    if kind.startswith(WORKLOAD_EVENT_PREFIX):
        # The workload named it; it is shown as its words, said to be from the workload.
        own = _plain(kind.removeprefix(WORKLOAD_EVENT_PREFIX))
        headline = f"From the workload: {own}" if own else "From the workload"
    elif kind in EVENT_WORDS:
        headline = EVENT_WORDS[kind]
    else:
        headline = _plain(kind).capitalize()
    said = _STATE_SAID_BY_EVENT.get(kind) == new_state
    state = state_words(new_state) if new_state and not said else ""
    if not headline and not state:
        headline = "Changed"
    return EventWords(headline=headline, state=state)


def retry_reason_words(reason: str) -> str:
    if not reason:
        return ""
    return RETRY_REASON_WORDS.get(reason) or _plain(reason)


def cancelled_reason(by: str | None) -> str:
    """The reason a run shows once a cancel has finished."""
    return f"Cancelled by {by}." if by else "Cancelled."


def cancelling_reason(by: str) -> str:
    """The reason a run shows while its processes are being stopped."""
    return f"Cancel requested by {by}; stopping its processes."


_DURATION_UNITS = (("day", 86400), ("h", 3600), ("min", 60), ("s", 1))


def duration_words(delta: timedelta, *, parts: int = 2) -> str:
    """``4 min 30 s``, ``2 h 5 min``, ``3 days 1 h``, ``12 s``: the ``parts`` largest units
    that are not zero, rounded to the smallest one shown (a page never shows a raw
    ``0:01:55.434714``). Under a second reads ``under 1 s``; ``parts=1`` is for estimates."""
    seconds = delta.total_seconds()
    if seconds < 1:
        return "under 1 s"
    for _ in range(2):  # rounding may carry into a larger unit: 59.6 s is 1 min
        first = next(index for index, (_, size) in enumerate(_DURATION_UNITS) if seconds >= size)
        shown = _DURATION_UNITS[first : first + parts]
        smallest = shown[-1][1]
        seconds = round(seconds / smallest) * smallest
    left = int(seconds)
    words: list[str] = []
    for name, size in shown:
        count, left = divmod(left, size)
        if count or not words:
            plural = "s" if name == "day" and count != 1 else ""
            words.append(f"{count} {name}{plural}")
    return " ".join(words)
