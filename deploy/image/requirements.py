"""Print the portal's Python requirements (the client's dependencies and the ``server``
extra) from pyproject.toml, one per line, for ``pip install -r``: the image installs its
dependencies before the code is copied in, so that a code change does not reinstall them.
Standard library only (runs in the image's build stage)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

project = tomllib.loads(Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml").read_text())
requirements = [
    *project["project"]["dependencies"],
    *project["project"]["optional-dependencies"]["server"],
]
sys.stdout.write("".join(f"{requirement}\n" for requirement in requirements))
