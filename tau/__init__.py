"""The TauGrid client package: the ``tau`` command line, the small SDK and the tau.yaml schema.

It imports nothing from Django, so the CLI can validate a ``tau.yaml`` offline exactly the
way the server does.
"""

__version__ = "0.1.0.dev0"
