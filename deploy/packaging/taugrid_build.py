"""The build backend of ``pip install <checkout>``: setuptools', building outside the checkout.

setuptools builds where the sources are (``build/`` and ``taugrid.egg-info`` beside the
code), and pip builds a local folder in place since 21.3: ``pip install .`` in a fresh clone
left both behind, and a later build would package a ``build/lib`` file whose source had been
deleted since. Each hook here is setuptools' own, run with ``build_base`` and ``egg_base`` in
a temporary folder that is removed when the hook returns (through ``DIST_EXTRA_CONFIG``, a
configuration file distutils reads after ``setup.cfg``; one the caller set is read too).

pyproject.toml names this module (``backend-path``); tests/cli/test_client_install.py
installs a copy of the checkout and checks that nothing was written into it.
"""

from __future__ import annotations

import configparser
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from setuptools import build_meta as _setuptools  # type: ignore[import-untyped]

Result = TypeVar("Result")


@contextmanager
def _outside_the_checkout() -> Iterator[None]:
    caller = os.environ.get("DIST_EXTRA_CONFIG")
    with tempfile.TemporaryDirectory(prefix="taugrid-build-") as scratch:
        config = configparser.ConfigParser(interpolation=None)
        if caller:
            config.read(caller)  # the caller's extra configuration, with these two settings
        for section, option, value in (
            ("build", "build_base", f"{scratch}/build"),
            ("egg_info", "egg_base", scratch),
        ):
            if not config.has_section(section):
                config.add_section(section)
            config.set(section, option, value)
        path = Path(scratch) / "setup.cfg"
        with path.open("w") as file:
            config.write(file)
        os.environ["DIST_EXTRA_CONFIG"] = str(path)
        try:
            yield
        finally:
            if caller is None:
                del os.environ["DIST_EXTRA_CONFIG"]
            else:
                os.environ["DIST_EXTRA_CONFIG"] = caller


def _outside(hook: Callable[..., Result]) -> Callable[..., Result]:
    def run(*args: Any, **kwargs: Any) -> Result:
        with _outside_the_checkout():
            return hook(*args, **kwargs)

    run.__name__ = hook.__name__
    run.__doc__ = hook.__doc__
    return run


get_requires_for_build_sdist = _outside(_setuptools.get_requires_for_build_sdist)
get_requires_for_build_wheel = _outside(_setuptools.get_requires_for_build_wheel)
get_requires_for_build_editable = _outside(_setuptools.get_requires_for_build_editable)
prepare_metadata_for_build_wheel = _outside(_setuptools.prepare_metadata_for_build_wheel)
prepare_metadata_for_build_editable = _outside(_setuptools.prepare_metadata_for_build_editable)
build_wheel = _outside(_setuptools.build_wheel)
build_editable = _outside(_setuptools.build_editable)
build_sdist = _outside(_setuptools.build_sdist)
