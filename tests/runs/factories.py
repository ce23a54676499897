"""Runs for tests, made the way real ones are: through submission, from tau.yaml text."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

from runs import submission
from runs.models import Run, RunState

ROOT = Path(__file__).resolve().parents[2]

TINY_SPEC = b"""schema_version: 1
name: tiny
run:
  entrypoint: main.py
  workload_kind: job
compute:
  cpus: 1
  memory: 256Mi
"""


#: The project TINY_SPEC runs (its entry point must be in the zip, or it is refused).
TINY_FILES = {"main.py": "print('hello from main.py')\n"}


def cluster_quota(workspace: Any, *, cpu: str = "64", memory: str = "256Gi") -> None:
    """CPU and memory quota beside the ``world`` workspaces' GPU rows, on their GPU flavor:
    what a workspace needs before it can submit on Kubernetes (Kueue admits nothing that asks
    for a resource its ClusterQueue has no quota for, and places a GPU worker's GPUs, CPUs
    and memory on one flavor, so ``runs.policy`` refuses such runs at submission)."""
    from tau.quantity import parse_quantity
    from workspaces.models import ResourceFlavor, WorkspaceQuota

    flavor = ResourceFlavor.objects.get(name="h100")
    for resource, amount in (("cpu", cpu), ("memory", memory)):
        WorkspaceQuota.objects.update_or_create(
            workspace=workspace,
            flavor=flavor,
            resource=resource,
            defaults={"nominal": parse_quantity(amount)},
        )


#: Every member's time: the same files always make the same zip (with the time of writing, two
#: zips of the same files made either side of a 2 s boundary differed, and a test that meant
#: to submit one bundle twice stored two).
ZIP_TIME = (2026, 1, 1, 0, 0, 0)


def zip_bytes(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in files.items():
            member = zipfile.ZipInfo(name, date_time=ZIP_TIME)
            if name.endswith("/"):
                member.external_attr = (0o40775 << 16) | 0x10  # a folder, as writestr makes it
            else:
                member.external_attr = 0o600 << 16
            archive.writestr(member, content, compress_type=zipfile.ZIP_DEFLATED)
    return buffer.getvalue()


def zip_directory(directory: Path) -> bytes:
    return zip_bytes(
        {
            str(path.relative_to(directory)): path.read_text()
            for path in sorted(directory.rglob("*"))
            if path.is_file()
        }
    )


def make_run(
    world: Any,
    *,
    who: str = "researcher",
    spec: bytes = TINY_SPEC,
    files: dict[str, str] | None = TINY_FILES,
    state: RunState | None = None,
) -> Run:
    """A submitted run in alpha; ``state`` forces a state afterwards (bypassing the machine,
    for tests that need a run in a given state and nothing else). ``files=None``: no zip."""
    bundle = io.BytesIO(zip_bytes(files)) if files is not None else None
    run = submission.submit(
        workspace=world.alpha, user=world.users[who], spec_source=spec, bundle=bundle
    )
    if state is not None:
        Run.objects.for_workspace(world.alpha).filter(pk=run.pk).update(state=state)
        run.refresh_from_db()
    return run
