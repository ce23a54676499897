"""``python -m tau.spec``: see ``tau.spec.cli``."""

from __future__ import annotations

import sys

from tau.spec.cli import main

if __name__ == "__main__":
    sys.exit(main())
