"""What ``tau init`` writes: a commented tau.yaml per template, a .tauignore and, when the
folder has none, a tiny train.py so the first ``tau run`` works as it stands."""

from __future__ import annotations

from typing import Final

_HEADER = """\
# tau.yaml: one workload for TauGrid (schema version 1). Field reference: docs/tau-yaml.md;
# check it offline with `tau run validate`, submit it with `tau run --config tau.yaml --watch`.
schema_version: 1
name: {name}{pad}# letters, digits and '-', starting with a letter (38 at most)
"""

_OUTPUTS = """
outputs:
  metrics_file: metrics.jsonl # JSON lines like {{"step": 10, "loss": 0.31}} in $TAU_OUTPUT_DIR
  artifacts: []               # files under $TAU_OUTPUT_DIR kept with the run's evidence

# resilience:
#   max_retries: 2            # retried after preemption, eviction, node faults
#   checkpoint_dir: checkpoints

# experiment:
#   project: my-project
#   tags: [baseline]
"""

TEMPLATES: Final[dict[str, str]] = {
    "cpu": _HEADER
    + """
run:
  entrypoint: train.py        # a script in this folder, or a command line
  workload_kind: job          # plain pods; `rayjob` starts a Ray cluster
  args: []
  max_runtime: 1h             # stop the run after this long

compute:                      # per worker
  cpus: 1
  memory: 1Gi

runtime:
  image: python:3.12-slim     # unset: your workspace's default image
  pip: []                     # e.g. [numpy>=2]
  env: {{}}                     # names starting with TAU_ are reserved
"""
    + _OUTPUTS,
    "gpu": _HEADER
    + """
run:
  entrypoint: train.py
  workload_kind: rayjob       # a KubeRay RayJob; the entry point is the Ray driver
  max_runtime: 4h

compute:                      # per worker
  gpus: 1                     # nvidia.com/gpu, 0 to 16 per worker
  workers: 1
  cpus: 8
  memory: 32Gi
  # gpu_type: h100            # a flavor your workspace offers

runtime:
  image: mcr.microsoft.com/aks/ai-runtime/ray:py3.12-ray2.56.0-cuda13.0
  pip:
    - torch>=2.4.0

# queue:
#   priority: high            # a priority your workspace allows; unset: its default
"""
    + _OUTPUTS,
    "torchrun": _HEADER
    + """
run:
  entrypoint: torchrun --nproc-per-node 8 train.py
  workload_kind: job          # one pod per worker; each gets torchrun's PET_* settings
  args: []
  max_runtime: 8h
  exclude:                    # not shipped (also see .tauignore)
    - data/**

compute:                      # per worker
  workers: 2
  gpus: 8
  cpus: 64
  memory: 512Gi

runtime:
  image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
  env:
    NCCL_DEBUG: WARN
"""
    + _OUTPUTS,
}

#: Where the templates' comments start (0-based), so that they line up under each other.
COMMENT_COLUMN: Final = 30


def tau_yaml(template: str, name: str) -> str:
    """The template's tau.yaml for a spec called ``name``, its comments lined up: the name's
    comment starts at :data:`COMMENT_COLUMN` too, whatever the name's length (one space after
    a name too long for that)."""
    pad = " " * max(1, COMMENT_COLUMN - len(f"name: {name}"))
    return TEMPLATES[template].format(name=name, pad=pad)


TAUIGNORE: Final = """\
# Left out of the code bundle `tau run` uploads (gitignore syntax; .gitignore applies too,
# and a `!pattern` here takes back what .gitignore leaves out).
.git/
.venv/
venv/
__pycache__/
*.pyc
.ipynb_checkpoints/
data/
checkpoints/
outputs/
*.ckpt
*.pt
wandb/
"""

TRAIN_PY: Final = '''\
"""A placeholder training script: replace it with yours."""

import json
import os
import pathlib

output = pathlib.Path(os.environ.get("TAU_OUTPUT_DIR", "outputs"))
output.mkdir(parents=True, exist_ok=True)
with open(output / "metrics.jsonl", "a") as metrics:
    for step in range(1, 11):
        loss = 1.0 / step
        print(f"step {step} loss {loss:.3f}", flush=True)
        metrics.write(json.dumps({"step": step, "loss": loss}) + "\\n")
'''
