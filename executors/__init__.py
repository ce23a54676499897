"""Where runs execute: one package per executor, each a Django app above the run core.

- ``executors.kubernetes`` — runs become Kueue-admitted Jobs and RayJobs on a cluster: the
  backend, the objects it renders, the watcher that follows them (and its status mapping, queue
  reading and heartbeat), and the Kueue side of the workspaces (the objects their quotas
  become, the sync that keeps Kueue in step, the usage Kueue reports, the RBAC the portal
  needs and ``manage.py cluster_check``).
- ``executors.local`` — runs execute on this machine: the backend and the agent
  (``manage.py run_agent``) that admits them against the workspaces' quotas and runs each
  attempt in a sandbox.

The core (``runs``, ``workspaces``, ``evidence``, ``identity``) asks an executor through
``runs.backends.RunBackend``, found by name (``runs.backends.registry``, setting
``TAU_BACKEND_CLASSES``); it never imports one, and no executor imports another
(``tests/test_layering.py``). A new kind of work (endpoints, pipeline stages) is added inside an
executor, with the hooks it needs connected in its ``AppConfig.ready()``.
"""
