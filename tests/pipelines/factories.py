"""Pipelines for the tests: a five-stage pipeline.yaml with two branches and a gate, each
stage a tiny CPU run in its own folder."""

from __future__ import annotations

import io
import textwrap
from typing import Any

from pipelines import orchestration
from pipelines.models import Pipeline
from tests.runs.factories import zip_bytes


def stage_spec(name: str, *, cpus: str = "1") -> str:
    return textwrap.dedent(
        f"""\
        schema_version: 1
        name: {name}
        run:
          entrypoint: main.py
          workload_kind: job
        compute:
          cpus: {cpus}
          memory: 256Mi
        """
    )


PIPELINE = """\
schema_version: 1
name: lifecycle
stages:
  prepare: {config: prepare/tau.yaml}
  train: {config: train/tau.yaml, needs: [prepare]}
  report: {config: report/tau.yaml, needs: [prepare]}
  evaluate: {config: evaluate/tau.yaml, needs: [train]}
  publish:
    config: publish/tau.yaml
    needs: [evaluate]
    when: "evaluate.metrics.accuracy >= 0.8"
"""

EVALUATE_PY = "import tau\ntau.log({'accuracy': 0.9})\n"


def pipeline_zip(pipeline: str = PIPELINE, **override: str) -> bytes:
    files = {"pipeline.yaml": pipeline}
    for stage in ("prepare", "train", "report", "evaluate", "publish"):
        files[f"{stage}/tau.yaml"] = stage_spec(stage)
        files[f"{stage}/main.py"] = EVALUATE_PY if stage == "evaluate" else "print('ok')\n"
    files.update(override)
    return zip_bytes(files)


def make_pipeline(
    world: Any,
    data: bytes | None = None,
    *,
    started: bool = True,
    workspace: Any = None,
    who: str = "researcher",
) -> Pipeline:
    """A pipeline (by default alpha's, submitted by the researcher); ``started``: its first
    step taken."""
    pipeline = orchestration.submit_pipeline(
        workspace=workspace or world.alpha,
        user=world.users[who],
        bundle=io.BytesIO(data if data is not None else pipeline_zip()),
    )
    if started:
        orchestration.advance(pipeline.pk)
        pipeline.refresh_from_db()
    return pipeline
