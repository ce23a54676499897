"""The portal's REST API as ``tau`` uses it: one httpx client, errors turned into exit codes.

Proxies come from the usual environment (``HTTPS_PROXY``, ``NO_PROXY``; httpx reads them), a
private certificate authority from ``TAU_CA_BUNDLE`` (or ``SSL_CERT_FILE``).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx

from tau import __version__

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_NOT_FOUND = 4
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """Something the user must fix; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILED, *, details: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.details = details


def _verify() -> ssl.SSLContext | bool:
    bundle = os.environ.get("TAU_CA_BUNDLE")
    if not bundle:
        return True
    try:
        return ssl.create_default_context(cafile=bundle)
    except (OSError, ssl.SSLError) as error:
        raise CliError(f"TAU_CA_BUNDLE={bundle}: cannot load it ({error}).", EXIT_USAGE) from None


#: Keys of a refusal whose messages are about the request as a whole, not one field.
_WHOLE_REQUEST_KEYS = ("detail", "__all__", "non_field_errors")
#: The portal's ``detail`` of a refusal about fields (portal.api.INVALID_REQUEST): the
#: fields at fault say it better, so it is left out when they are there.
_INVALID_REQUEST = "The request is not valid; nothing was changed."


def problem_text(body: Any) -> str:
    """The server's refusal in one line: ``detail`` (and other messages about the whole
    request) first, then each field's errors as ``field: message``."""
    if isinstance(body, dict):
        if body.get("detail") == _INVALID_REQUEST and set(body) - {"detail", "problems"}:
            body = {key: value for key, value in body.items() if key != "detail"}
        parts = []
        for key in _WHOLE_REQUEST_KEYS:
            if body.get(key):
                parts.append(_said(body[key]))
        for key, value in body.items():
            if key in _WHOLE_REQUEST_KEYS or key == "problems":
                continue
            parts.append(f"{key}: {_said(value)}")
        return " ".join(parts)
    if isinstance(body, list):
        return "; ".join(str(item) for item in body)
    return str(body)


def _said(value: Any) -> str:
    # A list of messages (as DRF answers them) is read as sentences, not as a Python list.
    return "; ".join(str(item) for item in value) if isinstance(value, list) else str(value)


class Api:
    """Calls to one portal with one token."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        headers = {"User-Agent": f"tau/{__version__}", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
            verify=_verify(),
            trust_env=True,
            follow_redirects=False,
        )

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise CliError(
                f"{self.url} did not answer in time; try again, or check the URL "
                "(`tau login --url …`) and any proxy (HTTPS_PROXY).",
            ) from None
        except httpx.TransportError as error:
            raise CliError(
                f"cannot reach {self.url}: {error}. Is the portal running, and is the URL "
                "right (`tau login --url …`, TAU_URL)? A private CA: set TAU_CA_BUNDLE.",
            ) from None
        self.check(response)
        return response

    def check(self, response: httpx.Response) -> None:
        status = response.status_code
        if status < 400:
            return
        body: Any = None
        media_type = response.headers.get("Content-Type", "")
        if "json" in media_type:
            try:
                body = response.json()
            except ValueError:
                body = None
        elif media_type.startswith("text/plain"):
            body = response.text.strip()[:500]
        said = problem_text(body) if body else ""
        if status == 404 and not said:
            raise CliError(
                f"not found: {response.request.url.path} (is {self.url} a TauGrid portal?)",
                EXIT_NOT_FOUND,
            )
        if status == 401:
            raise CliError(
                f"the portal refused the token ({said or 'not authenticated'}). "
                "Run `tau login` with a valid token, or fix TAU_TOKEN.",
                EXIT_AUTH,
                details=body,
            )
        if status == 403:
            raise CliError(f"not allowed: {said}", EXIT_AUTH, details=body)
        if status == 404:
            raise CliError(f"not found: {said or response.request.url.path}", EXIT_NOT_FOUND)
        if status in {400, 413}:
            raise CliError(
                said or f"the portal refused the request ({status}).", EXIT_USAGE, details=body
            )
        raise CliError(f"the portal answered {status}: {said}", EXIT_FAILED, details=body)

    def json_of(self, response: httpx.Response) -> Any:
        """The answer's JSON; a page that is not JSON means the URL is not a TauGrid API."""
        try:
            return response.json()
        except ValueError:
            where = response.headers.get("Location")
            moved = f" (it redirects to {where})" if where else ""
            raise CliError(
                f"{self.url} did not answer like a TauGrid portal{moved}: check the URL "
                "(`tau login --url …`, TAU_URL).",
            ) from None

    def get(self, path: str, **params: Any) -> Any:
        clean = {key: value for key, value in params.items() if value is not None}
        return self.json_of(self.request("GET", path, params=clean))

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.json_of(self.request("POST", path, json=body or {}))

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        return self.json_of(self.request("PATCH", path, json=body))

    def delete(self, path: str) -> None:
        self.request("DELETE", path)

    def pages(self, path: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every row of a cursor-paginated list (``results`` and ``next``)."""
        page: Any = self.get(path, **params)
        while True:
            if isinstance(page, list):
                yield from page
                return
            yield from page.get("results", [])
            following = page.get("next")
            if not following:
                return
            page = self.json_of(self.request("GET", following))


def run_path(workspace: str, name: str | None = None) -> str:
    path = f"/api/v1/workspaces/{quote(workspace, safe='')}/runs/"
    return path if name is None else f"{path}{quote(name, safe='')}/"


def workspace_path(workspace: str) -> str:
    return f"/api/v1/workspaces/{quote(workspace, safe='')}/"


def member_path(workspace: str, username: str | None = None) -> str:
    path = workspace_path(workspace) + "members/"
    return path if username is None else f"{path}{quote(username, safe='')}/"
