"""Every task the portal asks for by name exists under that name in its Celery app: the ones
Celery beat fires (``CELERY_BEAT_SCHEDULE``) and the ones the outboxes publish with
``send_task`` (module constants named ``*_TASK``). A name that drifts from its task (a module
moved, a task renamed) is otherwise found only in production, by a reconciler that never runs
or a row that waits for it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_layering import LAYERS, module_name, python_files

ROOT = Path(__file__).resolve().parents[2]


def published_names() -> dict[str, str]:
    """``module.CONSTANT`` → task name, for every module-level ``*_TASK`` string constant."""
    found: dict[str, str] = {}
    for package in LAYERS:
        for path in python_files(package):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in tree.body:
                target = value = None
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, value = node.targets[0], node.value
                elif isinstance(node, ast.AnnAssign):
                    target, value = node.target, node.value
                if (
                    isinstance(target, ast.Name)
                    and target.id.endswith("_TASK")
                    and isinstance(value, ast.Constant)
                    and isinstance(value.value, str)
                ):
                    found[f"{module_name(path)}.{target.id}"] = value.value
    return found


def registered() -> set[str]:
    from portal.celery import app

    app.loader.import_default_modules()
    return set(app.tasks)


def test_every_task_published_by_name_is_registered_under_it() -> None:
    names = published_names()
    # The outboxes' and the periodic jobs' (more may come; these must be found).
    assert {
        "runs.delivery.DELIVER_TASK",
        "evidence.sealing.SEAL_TASK",
        "evidence.verification.VERIFY_TASK",
        "executors.kubernetes.kueue_sync.SYNC_TASK",
        "notifications.delivery.SEND_TASK",
    } <= set(names)
    tasks = registered()
    assert {constant: name for constant, name in names.items() if name not in tasks} == {}


def beat_schedule(backend: str) -> dict[str, str]:
    """Entry → task name of the beat schedule the settings make for ``backend`` (read in a
    process of its own: the settings decide it when they are imported)."""
    script = (
        "import json, django; django.setup(); from django.conf import settings; "
        "print(json.dumps({k: v['task'] for k, v in settings.CELERY_BEAT_SCHEDULE.items()}))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings", "TAU_BACKEND": backend}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    schedule: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return schedule


@pytest.mark.parametrize("backend", ["local", "kubernetes"])
def test_every_task_beat_fires_is_registered(backend: str) -> None:
    fired = beat_schedule(backend)
    assert fired
    if backend == "kubernetes":  # the Kueue outbox's relay and drift check
        assert {"reconcile-kueue-syncs", "check-kueue-drift"} <= set(fired)
    tasks = registered()
    assert {entry: name for entry, name in fired.items() if name not in tasks} == {}
