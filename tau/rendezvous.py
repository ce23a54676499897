"""What each worker of a multi-worker run is told about the others: one table for every backend.

A run with ``compute.workers: N`` (``workload_kind: job``) starts N workers, each running the
entry point: N pods of an Indexed Job on Kubernetes, N processes in sandboxes of their own on
the local executor. Each gets the variables below, which ``torch.distributed``
(``init_process_group(init_method="env://")``) and ``torchrun`` (its ``PET_*`` options) read as
they are, so the same program and the same ``tau.yaml`` run on both (docs/distributed.md):

- ``MASTER_ADDR``, ``PET_MASTER_ADDR``: worker 0's address: ``<job>-0.<job>`` on Kubernetes
  (its pod, through the Job's headless Service), ``127.0.0.1`` on the local executor;
- ``MASTER_PORT``, ``PET_MASTER_PORT``: the port worker 0 listens on: 29500 on Kubernetes (a
  pod has its own network), a free port of the machine, chosen for the attempt, locally;
- ``WORLD_SIZE``, ``PET_NNODES``: N;
- ``RANK``, ``PET_NODE_RANK``: the worker's number, 0 to N-1 (a pod's completion index);
- ``LOCAL_RANK``: 0 (one process per pod, or per sandbox).

A variable the spec sets itself (``runtime.env`` or a secret) wins: TauGrid never silently
replaces what the researcher wrote. A single-worker run gets none of them.

Standard library only: the renderer and the local executor both import it.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from typing import Final


class Value(enum.Enum):
    """What a variable of the table holds; each backend knows how to say it."""

    MASTER_ADDR = "the address of worker 0"
    MASTER_PORT = "the port worker 0 listens on for the rendezvous"
    WORKERS = "the number of workers"
    RANK = "this worker's number, from 0"
    LOCAL_RANK = "this process's number on its machine or pod (always 0)"


#: The table, in the order the variables are set.
RENDEZVOUS: Final[tuple[tuple[str, Value], ...]] = (
    ("MASTER_ADDR", Value.MASTER_ADDR),
    ("MASTER_PORT", Value.MASTER_PORT),
    ("WORLD_SIZE", Value.WORKERS),
    ("RANK", Value.RANK),
    ("LOCAL_RANK", Value.LOCAL_RANK),
    ("PET_NNODES", Value.WORKERS),
    ("PET_NODE_RANK", Value.RANK),
    ("PET_MASTER_ADDR", Value.MASTER_ADDR),
    ("PET_MASTER_PORT", Value.MASTER_PORT),
)
NAMES: Final = tuple(name for name, _ in RENDEZVOUS)
#: torchrun's default rendezvous port (a pod has its own network, so it is always free there).
DEFAULT_PORT: Final = 29500


def environment(
    *, workers: int, rank: int, master_addr: str, master_port: int, taken: Collection[str] = ()
) -> dict[str, str]:
    """The table's variables for worker ``rank`` of ``workers``, without those in ``taken``
    (the names the spec sets itself)."""
    values: Mapping[Value, str] = {
        Value.MASTER_ADDR: master_addr,
        Value.MASTER_PORT: str(master_port),
        Value.WORKERS: str(workers),
        Value.RANK: str(rank),
        Value.LOCAL_RANK: "0",
    }
    return {name: values[value] for name, value in RENDEZVOUS if name not in taken}
