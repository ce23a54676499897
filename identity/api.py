"""``GET /api/v1/me/``: who the caller is, and what the token it came with may do — what
``tau whoami`` shows and ``tau run list --mine`` filters by."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from identity.tokens import token_of
from portal.api import refusals
from portal.requests import signed_in_user

#: The token of the request, inline and nullable (a $ref cannot be nullable in OpenAPI 3.0,
#: and validators read ``allOf`` + ``nullable`` differently).
TOKEN_SCHEMA = {
    "type": "object",
    "nullable": True,
    "description": "The token of this request; null when signed in by a session.",
    "properties": {
        "name": {"type": "string"},
        "workspace": {
            "type": "string",
            "nullable": True,
            "description": "The one workspace it reaches; null: every one of its user's.",
        },
        "read_only": {"type": "boolean", "description": "It may only read."},
        "scopes": {
            "type": "array",
            "items": {"type": "string", "enum": ["endpoints:invoke"]},
            "description": "What it may do beyond what every token may: `endpoints:invoke`, "
            "send requests to endpoints (`…/endpoints/{name}/invoke/{path}`).",
        },
        "expires_at": {"type": "string", "format": "date-time"},
    },
    "required": ["name", "workspace", "read_only", "scopes", "expires_at"],
}


@extend_schema_field(TOKEN_SCHEMA)
class TokenField(serializers.JSONField):
    pass


class MeSerializer(serializers.Serializer):  # type: ignore[type-arg]
    username = serializers.CharField()
    display_name = serializers.CharField(
        help_text="The name people read: full name, else username."
    )
    email = serializers.CharField(allow_blank=True)
    is_staff = serializers.BooleanField(help_text="Platform staff.")
    token = TokenField(allow_null=True)


class MeView(APIView):
    """Who you are, as the portal knows you, and the token you called with."""

    @extend_schema(responses={200: MeSerializer, **refusals(in_workspace=False)})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        user = signed_in_user(request)
        token = token_of(request)
        answer = {
            "username": user.get_username(),
            "display_name": user.get_full_name() or user.get_username(),
            "email": user.email or "",
            "is_staff": bool(user.is_staff),
            "token": None
            if token is None
            else {
                "name": token.name,
                "workspace": token.workspace.slug if token.workspace is not None else None,
                "read_only": token.read_only,
                "scopes": list(token.scopes or []),
                "expires_at": token.expires_at.isoformat().replace("+00:00", "Z"),
            },
        }
        return Response(MeSerializer(answer).data)
