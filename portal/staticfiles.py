"""Front-end libraries that come with Python packages, served as our own static files.

plotly.js ships inside the ``plotly`` package from PyPI, Swagger UI inside
``drf-spectacular-sidecar`` and htmx inside ``django-htmx``, so
``make run`` needs nothing but pip; nothing third-party is committed to this repository.
Only the files we use are exposed (the plotly package carries 10 MB of other data).
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

# static path → (package, file inside the package)
_SWAGGER_UI = "static/drf_spectacular_sidecar/swagger-ui-dist"
PACKAGED_ASSETS = {
    "vendor/plotly.min.js": ("plotly", "package_data/plotly.min.js"),
    # Swagger UI for /api/v1/docs/ (web/api_docs.py), from drf-spectacular-sidecar.
    **{
        f"vendor/swagger-ui/{name}": ("drf_spectacular_sidecar", f"{_SWAGGER_UI}/{name}")
        for name in (
            "swagger-ui.css",
            # The CSS names its source map: production's manifest storage (collectstatic)
            # refuses a reference to a file it cannot find.
            "swagger-ui.css.map",
            "swagger-ui-bundle.js",
            "swagger-ui-standalone-preset.js",
        )
    },
}


def _package_dir(package: str) -> Path:
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"the {package!r} package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


class PackagedAssetsFinder(BaseFinder):
    def _source(self, path: str) -> Path | None:
        entry = PACKAGED_ASSETS.get(path)
        if entry is None:
            return None
        package, inner = entry
        try:
            return _package_dir(package) / inner
        except LookupError:  # not installed: the file is not there (tests/test_api_docs.py)
            return None

    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> Any:
        source = self._source(path)
        if source is None or not source.exists():
            return [] if find_all else None
        return [str(source)] if find_all else str(source)

    def list(self, ignore_patterns: Any) -> Iterator[tuple[str, FileSystemStorage]]:
        for path in PACKAGED_ASSETS:
            source = self._source(path)
            if source is None or not source.exists():
                continue
            prefix, _, name = path.rpartition("/")
            storage = FileSystemStorage(location=str(source.parent))
            storage.prefix = prefix  # type: ignore[attr-defined]
            yield name, storage
