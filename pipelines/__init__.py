"""Pipelines (issue 35): the stages of a workload's life — data preparation, training,
fine-tuning, evaluation, an endpoint — as one tracked record. ``pipeline.yaml`` itself is
:mod:`tau.pipeline` (read and checked there, offline as on the server); this package decides
what a pipeline does next (:mod:`pipelines.planning`), from durable state only.

It sits above everything a stage uses (runs, the catalog, endpoints, evidence: it may import
them) and below ``web`` alone, which is the only package that may import it
(tests/test_layering.py)."""
