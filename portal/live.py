"""Live fragments: the ETag a poller sends back, and the answer that skips work when nothing
changed (static/js/portal.js polls with ``If-None-Match``; a 304 swaps nothing)."""

from __future__ import annotations

import hashlib
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def etag(*parts: Any) -> str:
    """A strong ETag of what a fragment shows, from the values it depends on."""
    return '"' + hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:32] + '"'


def not_modified(request: HttpRequest, tag: str) -> bool:
    return tag in {found.strip() for found in request.headers.get("If-None-Match", "").split(",")}


def tagged(response: HttpResponse, tag: str) -> HttpResponse:
    """``response`` with its ETag, revalidated by the browser each time it is used."""
    response["ETag"] = tag
    response["Cache-Control"] = "no-cache"
    return response


def fragment_response(
    request: HttpRequest, template: str, context: dict[str, Any], tag: str
) -> HttpResponse:
    """304 when the caller has ``tag`` already; else ``template`` rendered (with ``etag`` in
    its context, for the next poll)."""
    if not_modified(request, tag):
        return tagged(HttpResponse(status=304), tag)
    return tagged(render(request, template, {**context, "etag": tag}), tag)
