"""Prometheus' HTTP API as TauGrid reads it: instant and range queries, their answers as plain
values, and the two ways they fail.

Why a small client of our own and not a library: TauGrid asks two questions
(``/api/v1/query`` and ``/api/v1/query_range``) and needs exact control over three things a
general client hides — how long a page may wait (one ``timeout`` for connecting, reading and
Prometheus' own evaluation), which failures mean "telemetry is down, show the notice" and
which mean "this query is wrong, fix the code or the name override", and what is dropped
before anyone sees it (NaN, infinities and dcgm-exporter's "unsupported" sentinel).

Errors
======

- :class:`TelemetryUnavailable`: no usable answer — connection refused or reset, timeout, a
  5xx, a body that is not Prometheus' JSON, a 401/403/404 (wrong token or wrong URL: nothing
  a page can do but show the notice), or ``status: "error"`` of a kind that says the server is
  busy (``timeout``, ``canceled``, ``unavailable``, ``internal``). Pages show a notice and keep
  rendering what does not depend on Prometheus.
- :class:`TelemetryQueryError`: a 400 or 422 (``bad_data``, ``execution``): Prometheus
  understood the request and refused the query. That is a bug in TauGrid's PromQL or a metric
  or label name override that is not valid PromQL; retrying cannot help.

Messages name the URL (without any ``user:password@`` part) and what happened, so a platform
engineer can act on them; the bearer token is never in a message or a log.

Environment
===========

The HTTP client is built with ``trust_env=False``: ``HTTP(S)_PROXY``, ``NO_PROXY``,
``.netrc`` and ``SSL_CERT_FILE`` from the portal's environment are ignored. Prometheus is
normally next to the portal (in the cluster, or on loopback in development and tests), and a
proxy set for the portal's outbound traffic would otherwise swallow those requests or see the
token. A Prometheus behind TLS with a private CA takes ``ca_file``.

Requests are POSTs with a form body (Prometheus accepts both): a selector naming many pods
does not run into URL length limits of proxies in front of Prometheus.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    import httpx

__all__ = [
    "MAX_POINTS_PER_SERIES",
    "UNSUPPORTED_SENTINEL_MIN",
    "InstantSample",
    "PrometheusClient",
    "RangeSeries",
    "TelemetryError",
    "TelemetryQueryError",
    "TelemetryUnavailable",
    "fit_step",
    "match_any",
    "quote",
    "regex_alternation",
    "regex_escape",
]

#: dcgm-exporter writes a field the GPU does not support as DCGM's 64-bit "blank" codes
#: (``9223372036854775794`` is ``DCGM_INT64_NOT_SUPPORTED``; the family runs up to 2**63-1).
#: No real reading comes near, so anything from here up is dropped, whatever the metric.
UNSUPPORTED_SENTINEL_MIN: Final = 9.2e18
#: Prometheus refuses a range query with more points than this per series.
MAX_POINTS_PER_SERIES: Final = 11_000
#: Steps a fitted window rounds up to, in seconds: few distinct steps mean the same query
#: string for neighbouring windows, so answers cached for one viewer serve the next.
STEP_LADDER: Final[tuple[float, ...]] = (
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
)
# Prometheus' errorType values that mean "the server could not do it now", not "the query is
# wrong" (web/api/v1/api.go: errorTimeout, errorCanceled, errorUnavailable, errorInternal).
BUSY_ERROR_TYPES: Final = frozenset({"timeout", "canceled", "unavailable", "internal"})
# The most of an unexpected body worth quoting in a message.
BODY_EXCERPT_CHARS: Final = 200
# Characters RE2 gives a meaning to. RE2 rejects an escaped character that is not
# punctuation (``\ `` is an error), so Python's re.escape, which escapes spaces, will not do.
RE2_SPECIAL: Final = re.compile(r"([\\.+*?()|\[\]{}^$])")


class TelemetryError(Exception):
    """A question to Prometheus got no usable answer; ``str()`` says why, for a person."""


class TelemetryUnavailable(TelemetryError):
    """Prometheus did not answer usefully (down, slow, overloaded, wrong URL or token)."""


class TelemetryQueryError(TelemetryError):
    """Prometheus refused the query itself (400/422): a PromQL bug or a bad name override."""


@dataclass(frozen=True)
class InstantSample:
    """One series of an instant query's answer: its labels (``__name__`` included when
    Prometheus kept it) and its value."""

    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class RangeSeries:
    """One series of a range query's answer: its labels and its points, oldest first, as
    aware UTC datetimes. Dropped values (NaN, sentinel) leave gaps, not zeros."""

    labels: Mapping[str, str]
    points: list[tuple[datetime, float]]


def usable(value: float) -> bool:
    """False for values no chart or average may see: NaN, ±Inf, dcgm's sentinel."""
    return math.isfinite(value) and value < UNSUPPORTED_SENTINEL_MIN


def fit_step(start: datetime, end: datetime, *, points: int = 240, minimum: float = 15.0) -> float:
    """A range query's step for the window ``start``..``end``: about ``points`` points, rounded
    up to the next of 1 s, 2 s, 5 s, 10 s, 15 s, 30 s, 1 m, 2 m, 5 m, 10 m, 15 m, 30 m, 1 h, 2 h,
    3 h, 6 h, 12 h, 1 d (then whole days), and never below ``minimum`` (the scrape interval: a
    finer step only repeats samples)."""
    if points < 1:
        raise ValueError(f"points must be at least 1, not {points}")
    if minimum <= 0:
        raise ValueError(f"minimum must be a positive number of seconds, not {minimum}")
    window = (end - start).total_seconds()
    if window <= 0:
        raise ValueError(f"the window must end after it starts ({start} .. {end})")
    wanted = max(window / points, minimum)
    for step in STEP_LADDER:
        if step >= wanted:
            return float(step)
    return float(math.ceil(wanted / 86400) * 86400)


def quote(value: str) -> str:
    """``value`` as a PromQL string literal, double quotes included: ``\\``, ``"`` and line
    breaks escaped, so a label value from anywhere cannot end the selector early."""
    escaped = (
        value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    )
    return f'"{escaped}"'


def regex_escape(value: str) -> str:
    """``value`` as an RE2 pattern that matches exactly it (before string quoting)."""
    return RE2_SPECIAL.sub(r"\\\1", value)


def regex_alternation(values: Iterable[str]) -> str:
    """An RE2 pattern matching exactly the given strings (``a|b\\.c``), sorted and without
    repeats so the same set always gives the same query. An empty set is refused: ``=~""``
    would match every series *without* the label, the opposite of "none"."""
    unique = sorted(set(values))
    if not unique:
        raise ValueError("cannot build a selector matching none of no values; ask nothing")
    if any(value == "" for value in unique):
        raise ValueError("an empty value would match series without the label; leave it out")
    return "|".join(regex_escape(value) for value in unique)


def match_any(label: str, values: Iterable[str]) -> str:
    """A selector matcher: ``label="v"`` for one value, ``label=~"a|b"`` for several."""
    unique = sorted(set(values))
    if len(unique) == 1 and unique[0] != "":
        return f"{label}={quote(unique[0])}"
    return f"{label}=~{quote(regex_alternation(unique))}"


def safe_url(url: str) -> str:
    """``url`` without any ``user:password@`` part, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparseable address)"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def timestamp(moment: datetime) -> str:
    """A Unix timestamp for Prometheus. A naive datetime is refused: which zone it meant
    cannot be known, and guessing shifts every chart by hours."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{moment!r} has no time zone; pass an aware datetime (UTC)")
    return f"{moment.timestamp():.3f}"


def from_timestamp(value: Any) -> datetime:
    return datetime.fromtimestamp(float(value), tz=UTC)


def parse_value(raw: Any) -> float | None:
    """A sample value as Prometheus writes it (a string), or None when it is unusable."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if usable(value) else None


def excerpt(text: str) -> str:
    flat = " ".join(text.split())
    if len(flat) > BODY_EXCERPT_CHARS:
        flat = flat[:BODY_EXCERPT_CHARS] + "…"
    return flat or "(empty body)"


class PrometheusClient:
    """Queries to one Prometheus server (``url``: its base address, e.g.
    ``http://prometheus.monitoring:9090``, without ``/api/v1``). ``timeout`` bounds connecting
    and each read, and is sent as the query's own evaluation timeout; ``token`` goes out as a
    bearer token. Safe to share between threads (httpx's client is)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 2.0,
        token: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                f"the Prometheus URL must be an http(s) address such as "
                f"http://prometheus:9090, not {safe_url(url)!r}"
            )
        if timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # Imported here, not with the module: every Django process imports this one (the apps
        # check their metric names at start), and only those that query pay for httpx (~0.1 s).
        import httpx

        self._http = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout),
            trust_env=False,
            verify=ca_file if ca_file else True,
            follow_redirects=False,
        )

    def __repr__(self) -> str:
        return f"PrometheusClient({safe_url(self.url)!r}, timeout={self.timeout})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def query(self, expr: str, at: datetime | None = None) -> list[InstantSample]:
        """The instant query ``expr`` at ``at`` (now when None): one sample per series, values
        that are NaN, infinite or dcgm's sentinel left out. A scalar answer is one sample
        without labels."""
        form = {"query": expr}
        if at is not None:
            form["time"] = timestamp(at)
        data = self._post("/api/v1/query", form)
        result_type = data.get("resultType")
        result = data.get("result")
        if result_type == "scalar" and isinstance(result, list) and len(result) == 2:
            value = parse_value(result[1])
            return [] if value is None else [InstantSample(labels={}, value=value)]
        if result_type != "vector" or not isinstance(result, list):
            raise self._malformed("/api/v1/query", f"a {result_type!r} result, not a vector")
        samples = []
        for series in result:
            try:
                labels = dict(series["metric"])
                value = parse_value(series["value"][1])
            except (KeyError, IndexError, TypeError) as error:
                raise self._malformed("/api/v1/query", f"a series without {error}") from None
            if value is not None:
                samples.append(InstantSample(labels=labels, value=value))
        return samples

    def query_range(
        self, expr: str, start: datetime, end: datetime, step: float
    ) -> list[RangeSeries]:
        """The range query ``expr`` from ``start`` to ``end`` every ``step`` seconds (see
        :func:`fit_step`). Series whose every point was unusable are left out."""
        if step <= 0:
            raise ValueError(f"step must be a positive number of seconds, not {step}")
        window = (end - start).total_seconds()
        if window < 0:
            raise ValueError(f"the window must not end before it starts ({start} .. {end})")
        if window / step + 1 > MAX_POINTS_PER_SERIES:
            raise ValueError(
                f"a {window:.0f} s window at a {step:g} s step is more than Prometheus' "
                f"{MAX_POINTS_PER_SERIES} points per series; use fit_step()"
            )
        form = {
            "query": expr,
            "start": timestamp(start),
            "end": timestamp(end),
            "step": f"{step:g}",
        }
        data = self._post("/api/v1/query_range", form)
        result = data.get("result")
        if data.get("resultType") != "matrix" or not isinstance(result, list):
            raise self._malformed(
                "/api/v1/query_range", f"a {data.get('resultType')!r} result, not a matrix"
            )
        found = []
        for series in result:
            try:
                labels = dict(series["metric"])
                raw_points = series["values"]
                points = []
                for moment, raw in raw_points:
                    value = parse_value(raw)
                    if value is not None:
                        points.append((from_timestamp(moment), value))
            except (KeyError, TypeError, ValueError) as error:
                raise self._malformed(
                    "/api/v1/query_range", f"a series that does not parse ({error})"
                ) from None
            if points:
                found.append(RangeSeries(labels=labels, points=points))
        return found

    # --- the one place requests are made ------------------------------------------------

    def _post(self, path: str, form: dict[str, str]) -> dict[str, Any]:
        where = f"Prometheus at {safe_url(self.url)}"
        # Prometheus stops evaluating at its own timeout too, so a slow query does not keep
        # running on the server after the page has given up on it.
        form = {**form, "timeout": f"{self.timeout:g}s"}
        import httpx  # loaded by __init__ already

        try:
            response = self._http.post(path, data=form)
        except httpx.TimeoutException:
            raise TelemetryUnavailable(
                f"{where} did not answer within {self.timeout:g} s ({path})"
            ) from None
        except httpx.TransportError as error:
            raise TelemetryUnavailable(
                f"{where} cannot be reached: {describe_transport_error(error)} "
                "(is it running, and is TAU_PROMETHEUS_URL right?)"
            ) from None
        status = response.status_code
        if status in (401, 403):
            raise TelemetryUnavailable(
                f"{where} refused TauGrid's credentials ({status} {response.reason_phrase}): "
                "check TAU_PROMETHEUS_TOKEN"
            )
        if status == 404:
            raise TelemetryUnavailable(
                f"{where} has no {path} (404): TAU_PROMETHEUS_URL should be the server's base "
                "address (with any path prefix of a proxy in front), without /api/v1"
            )
        if 300 <= status < 400:
            raise TelemetryUnavailable(
                f"{where} redirects {path} to {response.headers.get('location', '?')} "
                f"({status}): set TAU_PROMETHEUS_URL to where it points"
            )
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or "status" not in body:
            kind = "a server error" if status >= 500 else "something that is not its API"
            raise TelemetryUnavailable(
                f"{where} answered {path} with {kind} ({status} "
                f"{response.reason_phrase}): {excerpt(response.text)}"
            )
        if body["status"] == "success":
            data = body.get("data")
            if not isinstance(data, dict):
                raise self._malformed(path, "no data")
            return data
        error_type = str(body.get("errorType") or "")
        message = str(body.get("error") or "no message")
        if status in (400, 422) and error_type not in BUSY_ERROR_TYPES:
            raise TelemetryQueryError(
                f"{where} refused the query {form['query']!r} ({error_type or status}): {message}"
            )
        raise TelemetryUnavailable(
            f"{where} could not answer {path} ({status}, {error_type or 'error'}): {message}"
        )

    def _malformed(self, path: str, what: str) -> TelemetryUnavailable:
        return TelemetryUnavailable(
            f"Prometheus at {safe_url(self.url)} answered {path} with {what}: is it a "
            "Prometheus-compatible API?"
        )


def describe_transport_error(error: httpx.TransportError) -> str:
    """The cause of a connection failure in a few words (httpx's own message is often the
    wrapped OS error's, e.g. "[Errno 111] Connection refused")."""
    import httpx

    if isinstance(error, httpx.ConnectError):
        text = str(error) or "connection failed"
        if "refused" in text.lower():
            return "connection refused"
        return text
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
