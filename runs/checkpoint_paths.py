"""Where a reported checkpoint may be: decided from the text of its path alone.

Every backend keeps a run's checkpoints in one folder of its own (``TAU_CHECKPOINT_DIR``);
a path a workload reports must lie inside it. This module holds the rules that need no disk
and no backend; each backend adds what only it can check (``RunBackend.checkpoint_path``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath


class CheckpointPathRefused(ValueError):
    """A checkpoint path that is not inside the run's own checkpoint folder; the message
    says why, for the workload that reported it."""


def parts_inside(folders: Sequence[PurePosixPath], path: str) -> tuple[str, ...]:
    """The names leading from the checkpoint folder to ``path``, decided from the text alone
    (nothing is looked at on disk): ``path`` is absolute inside one of ``folders`` (the same
    folder, spelled with and without links resolved), or relative to it. ``..`` is refused
    outright rather than resolved: resolving it needs the disk, and no checkpoint needs it."""
    if not path or "\x00" in path:
        raise CheckpointPathRefused("A checkpoint path must be a non-empty path.")
    if "://" in path:
        raise CheckpointPathRefused(
            "A checkpoint path is a path inside TAU_CHECKPOINT_DIR, not a URL."
        )
    candidate = PurePosixPath(path)
    if ".." in candidate.parts:
        raise CheckpointPathRefused("A checkpoint path may not contain '..'.")
    parts: tuple[str, ...] | None = None
    if not candidate.is_absolute():
        parts = candidate.parts
    else:
        for folder in folders:
            if candidate.parts[: len(folder.parts)] == folder.parts:
                parts = candidate.parts[len(folder.parts) :]
                break
    if parts is None:
        raise CheckpointPathRefused(
            f"A checkpoint must lie inside the run's checkpoint folder ({folders[0]}, "
            "TAU_CHECKPOINT_DIR)."
        )
    if not parts:
        raise CheckpointPathRefused(
            "A checkpoint is a file or folder inside TAU_CHECKPOINT_DIR, not the folder itself."
        )
    return parts
