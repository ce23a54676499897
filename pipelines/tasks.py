from celery import shared_task

from pipelines import orchestration


@shared_task(name=orchestration.ADVANCE_TASK, ignore_result=True, acks_late=True)
def advance(pipeline_id: int) -> bool:
    """Take the pipeline's next step (``pipelines.orchestration.advance``). True if it was
    running."""
    return orchestration.advance(pipeline_id) is not None


@shared_task(ignore_result=True)
def reconcile_pipelines() -> int:
    """A step for every running pipeline: a lost message, a worker killed in the middle, an
    endpoint stage become ready, all are caught up with here. How many were stepped."""
    count = 0
    for pipeline_id in orchestration.running_pipelines():
        try:
            orchestration.advance(pipeline_id)
        except Exception:  # one pipeline's trouble does not hold up the others
            orchestration.logger.exception("pipeline %s: the step failed", pipeline_id)
            continue
        count += 1
    return count
