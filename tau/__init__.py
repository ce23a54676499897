"""The TauGrid client package: the ``tau`` command line, the small SDK and the tau.yaml schema.

It imports nothing from Django, so the CLI can validate a ``tau.yaml`` offline exactly the
way the server does.
"""

__version__ = "0.1.0.dev0"

# The workload SDK (standard library only): ``import tau; tau.log_metrics(10, loss=0.3)``.
from tau.sdk import (
    checkpoint_saved,
    flush,
    log_metrics,
    report_from_every_rank,
    resume_from,
    save_artifact,
    track,
    trial_config,
)

__all__ = [
    "__version__",
    "checkpoint_saved",
    "flush",
    "log_metrics",
    "report_from_every_rank",
    "resume_from",
    "save_artifact",
    "track",
    "trial_config",
]
