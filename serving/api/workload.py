"""What an endpoint's own pods ask the portal for, with the endpoint's token
(``serving.workload_tokens``): its project zip (the bundle fetcher,
``executors.kubernetes.render.FETCH_SCRIPT``), the files of the model version it serves (the
stager, ``render.STAGE_SCRIPT``), and the stager's report. The same as a run's pods ask of
the run's routes, and held to the same rules:

- ``GET …/endpoints/{name}/bundle/``: for the endpoint's token and for whoever reads the
  workspace (as a run's bundle is);
- ``GET …/endpoints/{name}/model/`` and ``…/model/blobs/{sha256}/``: the listing in the one
  format the stager reads (``catalog.api.staging``, a run's datasets' too: here the files go
  straight under the model's folder) and each file's bytes, for the same callers;
- ``POST …/endpoints/{name}/report/model-staged/``: for the endpoint's token only, recorded in
  the endpoint's history (``services.record_model_staged``).

An endpoint token reaches these views only (``accepts_endpoint_tokens``; every other view
refuses it, ``identity.tokens.TokenScopePermission``), and through them only its own endpoint:
any other endpoint, of its workspace or another, does not exist to it (404).
"""

from __future__ import annotations

from typing import Any

from django.http import FileResponse, HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response

from catalog.api import staging
from catalog.models import AssetFile
from identity.models import ApiToken
from identity.tokens import token_of
from portal.api import BoundedJSONParser, FileDownloadNegotiation, refusals
from portal.rate_limits import window_wait
from runs import bundles
from runs.api import views as run_views
from serving import services
from serving.api.serializers import EndpointEventSerializer, ReportModelStagedSerializer
from serving.api.views import EndpointScopedViewSet
from serving.models import Endpoint
from workspaces.models import Role

#: Reports one endpoint token may send per minute: as many as a run token (its stagers report
#: once per pod and deployment, so this is room for many replicas at once).
REPORTS_PER_MINUTE = run_views.REPORTS_PER_MINUTE
REPORTS_429 = (
    f"Also: more than {REPORTS_PER_MINUTE} reports a minute with this endpoint token "
    "(`Retry-After` says when the next is taken)."
)


class EndpointWorkloadViewSet(EndpointScopedViewSet):
    """The endpoint named in the URL, which an endpoint token reaches only when it is the
    token's own; the workspace's members and their tokens reach every endpoint of it."""

    accepts_endpoint_tokens = True

    def get_object(self) -> Endpoint:
        endpoint = super().get_object()
        token = token_of(self.request)
        if (
            token is not None
            and token.kind == ApiToken.Kind.ENDPOINT
            and endpoint.token_id != token.pk
        ):
            raise exceptions.NotFound(
                f"This workspace has no endpoint named {self.kwargs['name']!r}."
            )
        return endpoint


class EndpointBundleViewSet(EndpointWorkloadViewSet):
    """The endpoint's project zip: for its own pods (its token) and for workspace members."""

    content_negotiation_class = FileDownloadNegotiation

    @extend_schema(
        responses={
            (200, "application/zip"): OpenApiResponse(
                OpenApiTypes.BINARY,
                description="The project zip as deployed (or updated); `X-Content-SHA256` is "
                "its SHA-256.",
            ),
            **refusals(words={404: "Also: the endpoint has no project zip."}),
        }
    )
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> FileResponse:
        endpoint = self.get_object()
        bundle = endpoint.bundle
        if bundle is None:
            raise exceptions.NotFound(
                "This endpoint has no project zip: its code comes with its image."
            )
        # FileResponse closes the file when the response is done.
        response = FileResponse(
            open(bundles.bundle_path(bundle.sha256), "rb"),  # noqa: SIM115
            content_type="application/zip",
            as_attachment=True,
            filename=f"{endpoint.name}.zip",
        )
        response["X-Content-SHA256"] = bundle.sha256
        return response


class EndpointModelViewSet(EndpointWorkloadViewSet):
    """The files of the model version the endpoint serves, for its stager (its token) and
    the workspace's members: ``model/`` lists them, ``model/blobs/{sha256}/`` answers one's
    bytes."""

    content_negotiation_class = FileDownloadNegotiation

    @extend_schema(
        responses={
            (200, "application/x-ndjson"): OpenApiResponse(
                OpenApiTypes.BINARY,
                description="JSON lines: first `{files, bytes, model: {ref, name, version, "
                "manifest_digest}}` (`model` null, and no file, for an endpoint that serves "
                "none), " + staging.LISTING_LINES + " `path` is the file's path in the "
                "version, under TAU_MODEL_DIR.",
            ),
            **refusals(),
        }
    )
    def listing(self, request: Request, *args: Any, **kwargs: Any) -> HttpResponseBase:
        endpoint = self.get_object()
        version = endpoint.model_version
        model = (
            None
            if version is None
            else {
                "ref": version.ref,
                "name": version.asset.name,
                "version": version.number,
                "manifest_digest": version.manifest_digest,
            }
        )
        return staging.listing_response(
            self.workspace.pk,
            [staging.Staged(version)] if version is not None else [],
            {"model": model},
        )

    @extend_schema(
        responses={
            (200, "application/octet-stream"): staging.BLOB_RESPONSE,
            **refusals(
                409,
                words={
                    404: "Also: the endpoint's model has no such file, or it is gone.",
                    409: "Also: the file of a version registered in place changed since (named).",
                },
            ),
        }
    )
    def blob(self, request: Request, *args: Any, **kwargs: Any) -> HttpResponseBase:
        endpoint = self.get_object()
        files = AssetFile.objects.for_workspace(self.workspace)
        return staging.blob_response(
            self.workspace,
            files.filter(version_id=endpoint.model_version_id)
            if endpoint.model_version_id is not None
            else files.none(),
            kwargs["sha256"],
            not_listed="The model this endpoint serves has no file with that SHA-256.",
        )


class EndpointReportViewSet(EndpointWorkloadViewSet):
    """What the endpoint's pods report, with its token and nothing else: the stager's
    ``model-staged``. At most REPORTS_PER_MINUTE reports a minute per token (429 with
    ``Retry-After``), as a run token's."""

    parser_classes = [BoundedJSONParser]
    # What OPTIONS describes (DRF asks the view for a serializer to describe a POST).
    serializer_class = ReportModelStagedSerializer

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        token = token_of(request)
        if token is None or token.kind != ApiToken.Kind.ENDPOINT:
            raise exceptions.PermissionDenied("Only an endpoint's own token reports on it.")
        self.endpoint = self.get_object()  # another endpoint's: 404
        wait = window_wait(f"endpointreports:{token.key}", REPORTS_PER_MINUTE, 60)
        if wait is not None:
            raise exceptions.Throttled(
                wait=wait,
                detail=f"An endpoint may report at most {REPORTS_PER_MINUTE} times a minute.",
            )

    def write_role_for(self, request: Request) -> Role:
        # The endpoint token is the authority here, as a run token is for its reports: its
        # pods keep reporting if its deployer's role changed (removal still stops them).
        return Role.VIEWER

    @extend_schema(
        request=ReportModelStagedSerializer,
        responses={
            201: EndpointEventSerializer,
            **refusals(
                400,
                413,
                words={
                    403: "Also: anything but the endpoint's own token.",
                    429: REPORTS_429,
                },
            ),
        },
    )
    def model_staged(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """The model is in place in one of the endpoint's pods: how many files and bytes,
        how long it took (recorded in the endpoint's history, a ``model_staged`` event)."""
        payload = ReportModelStagedSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        event = services.record_model_staged(self.endpoint, **payload.validated_data)
        return Response(EndpointEventSerializer(event).data, status=status.HTTP_201_CREATED)
