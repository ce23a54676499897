"""Serving: model endpoints (``run.workload_kind: rayservice``) whatever runs them — the
Endpoint record and its sealed, hash-chained history, deployment and its checks (the run
core's spec reading, workspace policy and bundles), scale, update, stop and delete, the
outbox that hands each instruction to a backend (``delivery``), what a backend's supervisor
observes, the pages (a workspace's endpoints, one endpoint, a model version's "Served by"
through ``serving.templatetags``), the API (with the proxy route that invokes an endpoint)
and the history's export.

It sits beside the run core and above the catalog (an endpoint serves a model version): it
may import ``runs``, ``catalog``, ``workspaces``, ``identity`` and ``portal``, never an
executor. The executors run endpoints above it and are asked through
``serving.backends.EndpointBackend``, found as the ``endpoints`` of the run backend the
registry names."""
