"""Specs every part of the package agrees on: the article's example, one using every field of
a run, and endpoints (``rayservice``) with a fixed number of replicas and with autoscaling.

The benchmark times them, the fuzzer mutates them, the tests and docs quote them. The
article's example is the contract's first promise: it must validate exactly as written.
"""

from __future__ import annotations

ARTICLE_EXAMPLE = """\
schema_version: 1
name: aks-gpu-quickstart

run:
  entrypoint: train.py
  workload_kind: rayjob

compute:
  gpus: 1
  workers: 1
  cpus: 16
  memory: 64Gi

runtime:
  image: mcr.microsoft.com/aks/ai-runtime/ray:py3.12-ray2.56.0-cuda13.0
  pip:
    - torch>=2.4.0
"""

FULL_EXAMPLE = """\
# Every field of schema version 1, set to something other than its default.
schema_version: 1
name: full-example

run:
  entrypoint: scripts/train.py --config configs/base.yaml
  workload_kind: job
  args: [--epochs, 10, --lr, 3.0e-4]
  project_dir: .
  exclude: [data/**, "*.ckpt", .git/**]
  max_runtime: 2h

compute:
  gpus: 8
  cpus: 32
  memory: 256Gi
  workers: 4
  gpu_type: h100

runtime:
  image: ghcr.io/example/trainer:1.4.2
  pip:
    - torch>=2.4.0
    - transformers[torch]==4.46.*
    - numpy<2; python_version < "3.13"
  env:
    WANDB_PROJECT: vision
    OMP_NUM_THREADS: 8
    DEBUG: "false"
  secrets:
    - {env: WANDB_API_KEY, secret: wandb, key: api-key}
    - {env: HF_TOKEN, secret: huggingface, key: token}

queue:
  priority: high
  name: research

resilience:
  max_retries: 5
  retry_on: [preempted, node_failure, oom_killed]
  backoff:
    initial: 30s
    max: 10m
  checkpoint_dir: checkpoints

inputs:
  datasets:
    - {name: imagenet, version: train, path: images/}
    - name: imagenet-labels
      version: 3

outputs:
  metrics_file: logs/metrics.jsonl
  artifacts: [model/**, eval/*.json]
  dataset: {name: imagenet-embeddings, path: embeddings}
  model: {name: resnet50-vision, path: model/}

experiment:
  project: vision
  group: lr-sweep
  tags: [baseline, resnet50]
"""

#: An endpoint as issue 34 writes it: a Ray Serve application of the project serving a model
#: version of the workspace, on two replicas of one GPU each.
SERVE_EXAMPLE = """\
schema_version: 1
name: tiny-endpoint
run:
  workload_kind: rayservice
serve:
  import_path: app:deployment     # a Ray Serve application in the project: module:attribute
  model: {name: tiny-gpt, version: production}
  replicas: 2
  route_prefix: /
compute: {gpus: 1, cpus: 8, memory: 32Gi}   # per replica
"""

#: Every field an endpoint may have, set to something other than its default.
SERVE_FULL_EXAMPLE = """\
schema_version: 1
name: chat-endpoint

run:
  workload_kind: rayservice
  project_dir: serving
  exclude: [notebooks/**]

serve:
  import_path: chat.serve:app
  model:
    name: tiny-gpt
    version: 3
  autoscaling:
    min_replicas: 0
    max_replicas: 4
    target_ongoing_requests: 8
  route_prefix: /v1/chat/

compute:
  gpus: 1
  cpus: 8
  memory: 32Gi
  gpu_type: h100
  head: {cpus: 1, memory: 4Gi}

runtime:
  image: ghcr.io/example/serve:2.1
  pip: [vllm==0.8.*]
  env: {MAX_TOKENS: 512}
  secrets:
    - {env: HF_TOKEN, secret: huggingface, key: token}

queue:
  priority: high

inputs:
  datasets:
    - {name: prompts, version: eval}

experiment:
  project: chat
  tags: [serving]
"""
