"""Evidence records and the outbox that makes sealing them durable.

A run that reaches a terminal state gets a :class:`SealRequest` in the same transaction
(``evidence.sealing.request_seal``, through ``runs.state.run_ended``); sealing it writes one
:class:`EvidenceRecord`. Both are keyed by the run's terminal event (``terminal_seq``): one
terminal state, one request, one record, however often sealing is tried — and a run that is
resumed and ends again has a new terminal event, so it gets a new record beside the old one.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.utils import timezone

from portal.tenancy import TenantModel


class SealRequest(TenantModel):
    """Outbox row: this run's evidence must be sealed for the terminal state its event
    ``terminal_seq`` recorded. Claimed for the time of one sealing (``claimed_at``, a lease
    renewed while it runs: ``portal.outbox.Lease``), it ends ``sealed_at``; a failed try is
    tried again after a doubling delay (``next_try_at``), and after
    ``evidence.sealing.MAX_TRIES`` failed tries it is given up (``given_up_at``, the reason in
    ``last_error``): the run page, the API and the admin say that the evidence could not be
    sealed and why, and staff can ask for it to be sealed again once the cause is fixed."""

    tenant_path: ClassVar[str | None] = "run__workspace"

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    terminal_seq = models.PositiveIntegerField(help_text="The seq of the terminal event.")
    attempt_count = models.PositiveIntegerField(help_text="The run's attempts when it ended.")
    created_at = models.DateTimeField(default=timezone.now)
    sealed_at = models.DateTimeField(null=True, blank=True)
    tries = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    next_try_at = models.DateTimeField(default=timezone.now)
    claimed_at = models.DateTimeField(null=True, blank=True)
    given_up_at = models.DateTimeField(
        null=True, blank=True, help_text="Sealing failed too often; last_error says why."
    )

    class Meta(TenantModel.Meta):
        constraints = [
            models.UniqueConstraint(
                fields=["run", "terminal_seq"], name="seal_request_unique_terminal"
            )
        ]
        indexes = [
            models.Index(
                fields=["next_try_at"],
                name="seal_request_due",
                condition=models.Q(sealed_at__isnull=True),
            )
        ]

    def __str__(self) -> str:
        return f"seal {self.run_id}#{self.terminal_seq}"


class EvidenceRecord(TenantModel):
    """A sealed record: the canonical manifest bytes and the ``manifest.sig`` bytes, exactly
    as exported. Everything else in the export is re-read from where TauGrid keeps it (the
    bundle, logs, artifacts) or regenerated from rows that do not change after the run ended
    (its first ``event_count`` events, the metric points of attempts up to ``attempt_count``);
    the manifest's ``files`` digests say whether they still match."""

    tenant_path: ClassVar[str | None] = "run__workspace"

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    terminal_seq = models.PositiveIntegerField(help_text="The seq of the terminal event.")
    state = models.CharField(max_length=20, help_text="The terminal state sealed.")
    attempt_count = models.PositiveIntegerField(help_text="Attempts the record covers.")
    event_count = models.PositiveIntegerField(help_text="Events the record covers.")
    manifest = models.BinaryField(help_text="manifest.json, RFC 8785 canonical JSON.")
    signature = models.BinaryField(help_text="manifest.sig, canonical JSON.")
    key_id = models.CharField(max_length=40)
    sealed_at = models.DateTimeField()
    # The portal's own check of the record as it exports now (``evidence.verification``):
    # after sealing, and again when someone asks. ``verify_requested_at`` is set while a check
    # is asked for and not done; ``verification_problems`` is what the last check found.
    # ``check_claimed_at`` is the claim of the worker checking it now (``portal.outbox.Lease``).
    verify_requested_at = models.DateTimeField(null=True, blank=True)
    check_claimed_at = models.DateTimeField(null=True, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)
    verification_problems = models.JSONField(default=list, blank=True)

    class Meta(TenantModel.Meta):
        constraints = [
            models.UniqueConstraint(fields=["run", "terminal_seq"], name="evidence_unique_terminal")
        ]
        indexes = [models.Index(fields=["run", "-terminal_seq"], name="evidence_newest")]

    def __str__(self) -> str:
        return f"evidence {self.run_id}#{self.terminal_seq}"

    @property
    def verifying(self) -> bool:
        """A check is asked for and not done yet."""
        return self.verify_requested_at is not None
