"""REST API of evidence: the public keyring, and a run's record as one file.

The export is a workspace route like every other under a run (``WorkspaceScopedViewSet``:
an outsider gets 404, the viewer role reads it); run tokens are refused, as everywhere but
the workload's own report routes — evidence is for people, not for the workload it judges.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, StreamingHttpResponse
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from evidence import keys, selectors
from evidence.export import FileGone, export_stream
from evidence.models import EvidenceRecord
from identity.tokens import TokenScopePermission
from portal.api import FileDownloadNegotiation, refusals
from runs import selectors as run_selectors
from runs.models import Run
from workspaces.access import WorkspaceScopedViewSet

KEYRING = inline_serializer(
    "EvidenceKeyring",
    {
        "keys": inline_serializer(
            "EvidenceKey",
            {
                "key_id": serializers.CharField(),
                "algorithm": serializers.CharField(),
                "public_key": serializers.CharField(help_text="Base64 of the 32 raw bytes."),
                "current": serializers.BooleanField(),
            },
            many=True,
        )
    },
)


class EvidenceKeysView(APIView):
    """Every public key evidence records were signed with: what ``tau evidence verify
    --key`` trusts. Public keys only, so anyone may read them."""

    authentication_classes: list[Any] = []
    # No authentication, so no token ever reaches TokenScopePermission; it stays listed
    # because every API view keeps it (tests/identity: a view without it is a finding).
    permission_classes = [AllowAny, TokenScopePermission]

    @extend_schema(auth=[], responses={200: KEYRING})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(keys.keyring())


RECORD = inline_serializer(
    "EvidenceEnding",
    {
        "ending_event": serializers.IntegerField(
            help_text="The seq of the run's event that recorded this ending (its key)."
        ),
        "attempts": serializers.IntegerField(
            help_text="The record covers attempts 1 to this one: the ending came after it."
        ),
        "status": serializers.ChoiceField(
            choices=["sealed", "sealing", "not_sealed"],
            help_text="`not_sealed`: sealing failed too often and was given up (`error`).",
        ),
        "state": serializers.CharField(allow_null=True, help_text="The state sealed."),
        "sealed_at": serializers.DateTimeField(allow_null=True),
        "key_id": serializers.CharField(allow_null=True),
        "verified_at": serializers.DateTimeField(
            allow_null=True, help_text="The portal's last check of the record as it exports."
        ),
        "verification_problems": serializers.ListField(child=serializers.CharField()),
        "error": serializers.CharField(allow_null=True, help_text="Why it could not be sealed."),
        "file_name": serializers.CharField(),
        "download": serializers.CharField(allow_null=True, help_text="The record's export."),
    },
    many=True,
)


class RunEvidenceViewSet(WorkspaceScopedViewSet):
    """A run's sealed evidence as one deterministic tar (docs/evidence.md): the present
    ending's, any ending's, and the list of every ending with its record."""

    base_queryset = Run.objects.all()
    content_negotiation_class = FileDownloadNegotiation

    def _run(self, name: str) -> Run:
        try:
            return run_selectors.resolve_run(self.workspace, name)
        except Http404 as exc:  # the selector's, in the API's own shape
            raise exceptions.NotFound(str(exc)) from None

    @extend_schema(
        responses={
            (200, "application/x-tar"): OpenApiResponse(
                OpenApiTypes.BINARY,
                description="The export: manifest.json, manifest.sig, then the record's files. "
                "`python -m tau.evidence verify FILE` checks it offline. Named "
                "`<run>-attempt-<n>.evidence.tar` (the ending came after attempt n).",
            ),
            **refusals(
                409,
                words={
                    409: "Also: the run is not finished, its evidence is still being sealed, "
                    "or it could not be sealed (`detail` says why)."
                },
            ),
        }
    )
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        """The record of the run's present ending (its newest)."""
        run = self._run(kwargs["run_name"])
        record = selectors.current_record(run)
        if record is None:
            return self._not_sealed(run)
        return _download(run, record)

    @extend_schema(
        responses={
            (200, "application/x-tar"): OpenApiResponse(
                OpenApiTypes.BINARY,
                description="The export of the record of one ending (`ending_event`, as the "
                "list of records names it); named `<run>-attempt-<n>.evidence.tar`.",
            ),
            **refusals(
                409,
                words={
                    404: "Also: the run has no sealed record for that ending.",
                    409: "Also: a file the record holds is no longer kept.",
                },
            ),
        }
    )
    def record(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        """The record of one ending of the run (a resumed run has one per ending)."""
        run = self._run(kwargs["run_name"])
        record = selectors.record_at(run, int(kwargs["ending_event"]))
        if record is None:
            raise exceptions.NotFound(
                f"{run.name} has no sealed evidence for event {kwargs['ending_event']}; "
                "GET …/evidence/records/ lists its records."
            )
        return _download(run, record)

    @extend_schema(responses={200: RECORD, **refusals()})
    def records(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Every ending of the run (a resumed run ends once per resume), the newest first, with
        its record's state and download."""
        run = self._run(kwargs["run_name"])
        answer = []
        for ending in selectors.endings(run):
            record = ending.record
            status_word = "sealed" if record else ("not_sealed" if ending.not_sealed else "sealing")
            answer.append(
                {
                    "ending_event": ending.terminal_seq,
                    "attempts": ending.attempts,
                    "status": status_word,
                    "state": record.state if record else None,
                    "sealed_at": record.sealed_at if record else None,
                    "key_id": record.key_id if record else None,
                    "verified_at": record.verified_at if record else None,
                    "verification_problems": record.verification_problems if record else [],
                    "error": ending.not_sealed,
                    "file_name": ending.file_name,
                    "download": request.build_absolute_uri(
                        reverse(
                            "api:run-evidence-record",
                            args=[self.workspace.slug, run.name, ending.terminal_seq],
                        )
                    )
                    if record
                    else None,
                }
            )
        return Response(answer)

    def _not_sealed(self, run: Run) -> Response:
        if run.is_live:
            why = "The run has not finished; its evidence is sealed when it does."
        else:
            newest = next(iter(selectors.endings(run, limit=1)), None)
            if newest is not None and newest.not_sealed:
                why = (
                    f"The run's evidence could not be sealed: {newest.not_sealed}. Sealing was "
                    "given up after repeated failures; the platform team can seal it again "
                    "once the cause is fixed."
                )
            else:
                why = "The run's evidence is being sealed; try again in a moment."
        return Response({"detail": why}, status=status.HTTP_409_CONFLICT)


def _download(run: Run, record: EvidenceRecord) -> Any:
    try:
        length, chunks = export_stream(record)
    except FileGone as gone:
        return Response(
            {"detail": f"The record cannot be exported: {gone}."},
            status=status.HTTP_409_CONFLICT,
        )
    response = StreamingHttpResponse(chunks, content_type="application/x-tar")
    response["Content-Length"] = str(length)
    name = selectors.file_name(run, record.attempt_count)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
