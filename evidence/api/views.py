"""REST API of evidence: the public keyring, and a run's record as one file.

The export is a workspace route like every other under a run (``WorkspaceScopedViewSet``:
an outsider gets 404, the viewer role reads it); run tokens are refused, as everywhere but
the workload's own report routes — evidence is for people, not for the workload it judges.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from evidence import keys, selectors
from evidence.export import FileGone, export_stream
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


class RunEvidenceViewSet(WorkspaceScopedViewSet):
    """A run's sealed evidence as one deterministic tar (docs/evidence.md)."""

    base_queryset = Run.objects.all()
    content_negotiation_class = FileDownloadNegotiation

    @extend_schema(
        responses={
            (200, "application/x-tar"): OpenApiResponse(
                OpenApiTypes.BINARY,
                description="The export: manifest.json, manifest.sig, then the record's files. "
                "`python -m tau.evidence verify FILE` checks it offline.",
            ),
            **refusals(
                409,
                words={
                    409: "Also: the run is not finished, or its evidence is still being sealed."
                },
            ),
        }
    )
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        try:
            run = run_selectors.resolve_run(self.workspace, kwargs["run_name"])
        except Http404 as exc:  # the selector's, in the API's own shape
            raise exceptions.NotFound(str(exc)) from None
        record = selectors.current_record(run)
        if record is None:
            why = (
                "The run has not finished; its evidence is sealed when it does."
                if run.is_live
                else "The run's evidence is being sealed; try again in a moment."
            )
            return Response({"detail": why}, status=status.HTTP_409_CONFLICT)
        try:
            length, chunks = export_stream(record)
        except FileGone as gone:
            return Response(
                {"detail": f"The record cannot be exported: {gone}."},
                status=status.HTTP_409_CONFLICT,
            )
        response = StreamingHttpResponse(chunks, content_type="application/x-tar")
        response["Content-Length"] = str(length)
        response["Content-Disposition"] = (
            f'attachment; filename="{run.name}-{record.terminal_seq}.evidence.tar"'
        )
        return response
