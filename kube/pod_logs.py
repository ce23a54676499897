"""A pod's log through the API server (``pods/log``): the one read that answers text, not JSON.

The API server asks the node's kubelet for the container's log and streams it back as plain
bytes. It cannot start at a byte offset: ``limitBytes`` cuts from the start and
``tailLines`` counts lines from the end, so a caller that follows a log by offset reads it
from the start, up to its size cap, and slices. Every call has a timeout, like every other
call through :mod:`kube`, and fails with the same :class:`~kube.errors.KubeError` kinds
(a container that has not started yet is a 400, :class:`~kube.errors.Invalid`, whose
message says so).
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

import urllib3

from kube.api import KubeClient, Timeout
from kube.errors import error_from_response

__all__ = ["read_pod_log"]


def read_pod_log(
    client: KubeClient,
    namespace: str,
    pod: str,
    *,
    container: str | None = None,
    limit_bytes: int | None = None,
    tail_lines: int | None = None,
    timeout: Timeout | None = None,
) -> bytes:
    """The log of ``container`` (the pod's only one when None) of ``pod``: at most
    ``limit_bytes`` from its start, or its last ``tail_lines`` lines."""
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/log"
    query: list[tuple[str, str | int]] = []
    if container:
        query.append(("container", container))
    if limit_bytes is not None:
        query.append(("limitBytes", max(1, int(limit_bytes))))
    if tail_lines is not None:
        query.append(("tailLines", max(0, int(tail_lines))))
    request = client.api.param_serialize(
        "GET",
        path,
        query_params=query,
        header_params={"Accept": "text/plain, */*"},
        auth_settings=["BearerToken"],
    )
    limit = timeout if timeout is not None else client.timeout
    from kubernetes.client.exceptions import ApiException  # loaded with client.api

    try:
        response = client.api.call_api(*request, _request_timeout=limit)
        read: Callable[[], bytes | None] = response.read
        data = read() or b""
    except urllib3.exceptions.HTTPError as error:
        raise client._unreachable(error, limit) from None
    except ApiException as error:
        if error.status:
            raise error_from_response(int(error.status), error.body) from None
        raise client._unreachable(error, limit) from None
    status = int(response.status)
    if not 200 <= status <= 299:
        raise error_from_response(status, data, http_reason=str(response.reason or ""))
    return data
