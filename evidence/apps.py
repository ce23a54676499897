"""Evidence: the sealed, verifiable record of every run.

Config, code, logs, metrics and checkpoints, kept after the cluster objects are gone.
"""

from django.apps import AppConfig


class EvidenceConfig(AppConfig):
    name = "evidence"
    verbose_name = "Evidence"

    def ready(self) -> None:
        # The run core sits below this app and cannot call it: it announces a run's ending,
        # and the seal request is written in that same transaction.
        from evidence.sealing import request_seal
        from runs.state import run_ended

        run_ended.connect(request_seal, dispatch_uid="evidence.request_seal")
