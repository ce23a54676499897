"""The catalog: a workspace's datasets and models, their immutable numbered versions (each a
manifest of files kept by content), aliases and lineage (issue 33).

A version is built from a folder by :mod:`catalog.ingest` (a run's output, an upload once
complete, a folder the portal can read), recorded file by file with the digests of
:mod:`tau.manifest`, the same code the ``tau`` client checks a local copy with. Its bytes
live in the workspace's part of the storage (:mod:`catalog.storage`), kept once per SHA-256.
"""

from django.apps import AppConfig


class CatalogConfig(AppConfig):
    name = "catalog"
    verbose_name = "Datasets and models"
