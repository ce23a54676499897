"""A pipeline's history: append-only events in a hash chain, linked and checked as a run's
are (``portal.event_chain``; the content names the pipeline as ``pipeline``). Events are
appended under the pipeline's row lock (``pipelines.orchestration.lock_pipeline``), so two
writers never give two events the same place."""

from __future__ import annotations

import enum
from typing import Any

from django.utils import timezone

from pipelines.models import Pipeline, PipelineEvent
from portal.event_chain import chain_is_whole, json_data, link

#: What a pipeline's events name it by in their hashed content (``tau.evidence.chain``).
SUBJECT = "pipeline"


class PipelineEventKind(enum.StrEnum):
    SUBMITTED = "submitted"
    STAGE_STARTED = "stage_started"  # its run (or endpoint) was written
    STAGE_NOT_STARTED = "stage_not_started"  # refused when it was to start (named why)
    STAGE_REUSED = "stage_reused"  # an earlier run of the same spec, code and inputs stands
    STAGE_RESUMED = "stage_resumed"  # its run was resumed (a new attempt) by a resume
    STAGE_ENDED = "stage_ended"  # its run ended, or its endpoint became ready or failed
    STAGE_HELD = "stage_held"  # a gate said no, or a stage before it ended badly
    GATE = "gate"  # a gate decided: the value it read and whether it passed
    CANCEL_REQUESTED = "cancel_requested"
    RESUMED = "resumed"  # running again from the stages that did not succeed
    ENDED = "ended"  # the pipeline's own state became final


def append_event(
    pipeline: Pipeline,
    kind: PipelineEventKind,
    *,
    message: str = "",
    data: dict[str, Any] | None = None,
    old_state: str = "",
    new_state: str = "",
    first: bool = False,
) -> PipelineEvent:
    """Add an event to the pipeline's chain. The caller holds the pipeline's row lock (or has
    just created the pipeline, which then has no events yet: ``first``)."""
    last = (
        None
        if first
        else PipelineEvent.objects.for_workspace(pipeline.workspace_id)
        .filter(pipeline=pipeline)
        .order_by("-seq")
        .first()
    )
    event = PipelineEvent(
        pipeline=pipeline,
        time=timezone.now(),
        kind=PipelineEventKind(kind).value,
        old_state=old_state,
        new_state=new_state,
        message=message,
        data=json_data(data),
    )
    link(event, last=last, subject=SUBJECT, subject_id=pipeline.pk)
    event.save()
    return event


def verify_event_chain(pipeline: Pipeline) -> bool:
    """Whether the pipeline's events form an unbroken chain from the first one."""
    events = (
        PipelineEvent.objects.for_workspace(pipeline.workspace_id)
        .filter(pipeline=pipeline)
        .order_by("seq")
    )
    return chain_is_whole(events, subject=SUBJECT, subject_id=pipeline.pk)
