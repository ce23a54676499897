"""Runs: the core of a run's life whatever executes it — the tau.yaml spec on the server,
submission and its policy, states and events, attempts, retries and checkpoints, the outbox
that hands work to an executor (``delivery``), and the run pages and API. The executors live
above it (``executors.kubernetes``, ``executors.local``); the core asks them through
``runs.backends.RunBackend``."""
