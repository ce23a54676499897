"""What the other apps announce, turned into events (``notifications.services.notify``).

Both receivers run inside the transaction of the change they are told of (a run's
``transition``, a budget check) and only write rows: a receiver that called out would hold
up the change. Their writes are in a savepoint, and whatever goes wrong there is logged and
dropped: a notification lost to a bug is bad, a run that cannot end because of it is worse.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from notifications import events
from notifications.services import Event, notify
from portal.notices import Notice
from runs.models import (
    EventKind,
    FailureClass,
    Run,
    RunAttempt,
    RunEvent,
    RunState,
    failure_hint_for,
)
from workspaces.models import Workspace

logger = logging.getLogger(__name__)

#: Which new state is which event (CANCELLED only when someone else cancelled).
_EVENT_FOR_STATE = {
    RunState.SUCCEEDED: events.RUN_SUCCEEDED,
    RunState.FAILED: events.RUN_FAILED,
    RunState.PREEMPTED: events.RUN_PREEMPTED,
    RunState.CANCELLED: events.RUN_CANCELLED,
}


def _absolute(path: str) -> str:
    return f"{settings.TAU_PUBLIC_URL}{path}"


def run_url(run: Run) -> str:
    return _absolute(
        reverse("run-page", kwargs={"workspace_slug": run.workspace.slug, "run_name": run.name})
    )


def run_payload(
    run: Run, event: str, title: str, data: dict[str, Any], *, at: datetime | None = None
) -> dict[str, Any]:
    """What every channel is built from (JSON types only): the event, the run, its page."""
    url = run_url(run)
    return {
        "event": event,
        "time": (at or timezone.now()).isoformat(),
        "workspace": run.workspace.slug,
        "title": title,
        "url": url,
        "run": {
            "name": run.name,
            "spec_name": run.spec_name,
            "state": run.state,
            "submitted_by": run.submitted_by_username,
            "attempt": run.attempt_count,
            "url": url,
        },
        "data": data,
    }


def _cancelled_by(run: Run, event: RunEvent) -> str:
    """Who cancelled: the CANCELLED event says so when the run stopped at once; a run that
    was being stopped (CANCELLING → CANCELLED) says it in its cancel-requested event."""
    by = (event.data or {}).get("by")
    if by:
        return str(by)
    requested = (
        RunEvent.objects.for_workspace(run.workspace_id)
        .filter(run=run, kind=EventKind.CANCEL_REQUESTED)
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )
    return str((requested or {}).get("by") or "")


def _failure(run: Run, event: RunEvent) -> dict[str, Any]:
    attempt = (
        RunAttempt.objects.for_workspace(run.workspace_id)
        .filter(run=run)
        .order_by("-number")
        .only("failure_class", "log_size", "exit_code", "failure_message")
        .first()
    )
    failure_class = run.failure_class or (attempt.failure_class if attempt else "") or "unknown"
    reason = run.state_reason or event.message
    if attempt is not None and attempt.failure_class:
        hint = attempt.failure_hint
    else:
        hint = failure_hint_for(failure_class, log_size=0, exit_code=None, failure_message=reason)
    label = FailureClass(failure_class).label if failure_class in FailureClass.values else ""
    return {
        "failure_class": failure_class,
        "failure_class_label": label,
        "reason": reason,
        "hint": hint,
    }


@contextmanager
def _contained(what: str) -> Iterator[None]:
    """A savepoint whose failure is logged, not raised into the change being told of."""
    try:
        with transaction.atomic():
            yield
    except Exception:
        logger.exception("could not write the notifications of %s; nobody is told of it", what)


def on_run_changed(
    sender: Any,
    *,
    run: Run,
    old_state: RunState,
    new_state: RunState,
    event: RunEvent,
    **kwargs: Any,
) -> None:
    """``runs.state.run_changed``: a finished, failed, preempted or (by someone else)
    cancelled run becomes its event."""
    name = _EVENT_FOR_STATE.get(RunState(new_state))
    if name is None:
        return
    with _contained(f"{name} of run {run.name}"):
        _tell_run_changed(run, name, old_state, new_state, event)


def _tell_run_changed(
    run: Run, name: str, old_state: RunState, new_state: RunState, event: RunEvent
) -> None:
    data: dict[str, Any] = {"old_state": str(old_state), "new_state": str(new_state)}
    if name == events.RUN_SUCCEEDED:
        title = f"Run {run.name} succeeded"
    elif name == events.RUN_FAILED:
        data.update(_failure(run, event))
        title = f"Run {run.name} failed: {data['failure_class_label'] or data['failure_class']}"
    elif name == events.RUN_PREEMPTED:
        data["reason"] = run.state_reason or event.message
        title = f"Run {run.name} was preempted"
    else:
        by = _cancelled_by(run, event)
        if by and by == run.submitted_by_username:
            return  # they know: they did it themselves
        data["cancelled_by"] = by or "someone"
        title = f"Run {run.name} was cancelled by {data['cancelled_by']}"
    notify(
        Event(
            name=name,
            workspace=run.workspace,
            title=title,
            payload=run_payload(run, name, title, data),
            key=f"run:{run.pk}",
            submitter_id=run.submitted_by_id,
        )
    )


def on_notice(sender: Any, *, notice: Notice, **kwargs: Any) -> None:
    """``portal.notices.notice``: another app's notice (a budget threshold) as its event."""
    if notice.event not in events.EVENTS:
        logger.warning("notice %r is no event people can be told of; ignored", notice.event)
        return
    with _contained(f"notice {notice.event} ({notice.key})"):
        _tell_notice(notice)


def _tell_notice(notice: Notice) -> None:
    workspace = Workspace.objects.unscoped().get(pk=notice.workspace_id)
    run = (
        Run.objects.for_workspace(workspace).select_related("workspace").get(pk=notice.run_id)
        if notice.run_id is not None
        else None
    )
    if run is not None:
        payload = run_payload(run, notice.event, notice.title, dict(notice.data))
    else:
        payload = {
            "event": notice.event,
            "time": timezone.now().isoformat(),
            "workspace": workspace.slug,
            "title": notice.title,
            "url": _absolute(reverse("workspace-home", kwargs={"workspace_slug": workspace.slug})),
            "run": None,
            "data": dict(notice.data),
        }
    notify(
        Event(
            name=notice.event,
            workspace=workspace,
            title=notice.title,
            payload=payload,
            key=notice.key,
            submitter_id=run.submitted_by_id if run is not None else None,
        )
    )
