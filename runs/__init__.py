"""Runs: the tau.yaml spec on the server, run lifecycle, executors, reconciler and renderers."""
