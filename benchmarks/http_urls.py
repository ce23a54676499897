"""The product's URLs plus two bare DRF views, for the HTTP benchmark only
(``benchmarks/http_settings.py``; never mounted by the product).

Every HTTP figure of ``make bench`` is reported as a share of :class:`BareView`'s throughput
measured in the same run, on the same server, client and settings: absolute numbers drift
between machines and with what else runs, the ratio much less. ``BareView`` has no
authentication and no permissions (the floor: gunicorn, the project's whole middleware stack,
DRF's dispatch and JSON renderer, nothing of TauGrid's own); :class:`TokenBareView` adds the
API's real authentication and permissions, to show what a token check costs.
"""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern, URLResolver, path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from web.urls import urlpatterns as product_urlpatterns


class BareView(APIView):
    authentication_classes = []
    permission_classes = []

    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response({"ok": True})


class TokenBareView(APIView):
    """The API's default authentication (bearer token first) and permissions."""

    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response({"ok": True})


urlpatterns: list[URLPattern | URLResolver] = [
    path("bench/bare/", BareView.as_view(), name="bench-bare"),
    path("bench/bare-token/", TokenBareView.as_view(), name="bench-bare-token"),
    *product_urlpatterns,
]
