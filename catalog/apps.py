"""The catalog: a workspace's datasets and models, their immutable numbered versions (each a
manifest of files kept by content), aliases and lineage (issue 33).

A version is built from a folder by :mod:`catalog.ingest` (a run's output, an upload once
complete, a folder the portal can read), recorded file by file with the digests of
:mod:`tau.manifest`, the same code the ``tau`` client checks a local copy with. Its bytes
live in the workspace's part of the storage (:mod:`catalog.storage`), kept once per SHA-256.
Its pages (:mod:`catalog.views`) show a workspace's datasets and models, their versions and
lineage; the run page's Data section is its template tag (``catalog_tags.run_data``), so that
the run core below it imports nothing of the catalog.
"""

from django.apps import AppConfig


class CatalogConfig(AppConfig):
    name = "catalog"
    verbose_name = "Datasets and models"

    def ready(self) -> None:
        from django.conf import settings

        from catalog.runs import DATASET_INPUTS
        from catalog.uploads import declaration_limit
        from portal.body_limits import BODY_LIMITS
        from runs.submission import EXTENSIONS

        # Every submission pins the dataset versions its spec reads (catalog.runs).
        if DATASET_INPUTS not in EXTENSIONS:
            EXTENSIONS.append(DATASET_INPUTS)

        # Declaring an upload's files takes a larger body than other calls (streamed, up to
        # TAU_DATA_MAX_FILES files; as JSON, the parser's own smaller limit); each piece of a
        # file is a body of its own.
        for kind in ("dataset", "model"):
            BODY_LIMITS[f"api:{kind}-versions"] = lambda method: (
                declaration_limit() if method == "POST" else None
            )
            BODY_LIMITS[f"api:{kind}-version-file"] = lambda method: (
                settings.TAU_DATA_UPLOAD_PIECE_BYTES if method == "PUT" else None
            )
