"""REST API for a workspace's webhooks: its admins list, add and remove them."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from notifications import services
from notifications.api.serializers import WebhookCreateSerializer, WebhookSerializer
from notifications.models import Webhook
from portal.api import refusals
from portal.requests import signed_in_user
from workspaces.access import WorkspaceScopedViewSet
from workspaces.models import Role

ADMINS_ONLY = {403: "Webhooks are for the workspace's admins."}


class WebhookViewSet(WorkspaceScopedViewSet):
    """The workspace's webhooks. Only its admins see and change them: a webhook's URL can
    be a credential itself (a chat's incoming-webhook URL). Each delivery is a POST signed
    with the webhook's secret: ``X-TauGrid-Timestamp: <unix seconds>`` and
    ``X-TauGrid-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<raw body>">``."""

    serializer_class = WebhookSerializer
    read_role = Role.ADMIN
    write_role = Role.ADMIN
    base_queryset = Webhook.objects.order_by("created_at", "id")
    lookup_field = "pk"
    lookup_url_kwarg = "webhook_id"

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "workspace_slug": self.workspace.slug}

    @extend_schema(responses={200: WebhookSerializer(many=True), **refusals(words=ADMINS_ONLY)})
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(
            WebhookSerializer(
                self.get_queryset(), many=True, context=self.get_serializer_context()
            ).data
        )

    @extend_schema(
        request=WebhookCreateSerializer,
        responses={
            201: WebhookSerializer,
            **refusals(
                400,
                413,
                words={
                    **ADMINS_ONLY,
                    400: "Also when the workspace has as many webhooks as it may have "
                    "(`TAU_WEBHOOKS_PER_WORKSPACE`, 20 by default); `detail` says so.",
                },
            ),
        },
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = WebhookCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        try:
            webhook = services.create_webhook(
                workspace=self.workspace,
                url=payload.validated_data["url"],
                secret=payload.validated_data["secret"],
                events=payload.validated_data["events"],
                fmt=payload.validated_data["format"],
                by=signed_in_user(request),
            )
        except DjangoValidationError as exc:
            errors = dict(exc.message_dict)
            general = errors.pop(NON_FIELD_ERRORS, [])
            raise ValidationError({**({"detail": general} if general else {}), **errors}) from None
        return Response(
            WebhookSerializer(webhook, context=self.get_serializer_context()).data,
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(responses={204: None, **refusals(words=ADMINS_ONLY)})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.delete_webhook(webhook=self.get_object(), by=signed_in_user(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
