"""What every TauGrid process pays to start: ``django.setup()`` (a Celery worker, the local
agent, each ``manage.py`` command, a portal worker). The suite starts hundreds of them, and a
platform many more: what only a page or the API schema needs is not loaded there."""

from __future__ import annotations

from pathlib import Path

from tests.fresh_process import probe

#: Loaded on first use only. drf-spectacular's helpers bring django.test and Jinja2 with them
#: (about a third of the start-up: 0.93 → 0.63 s of CPU here without them); the OpenID
#: client, JWT and requests are for sign-ins and /readyz (another 0.1 s). DRF's fields (with
#: the postgres form fields and markdown they bring) are for the web server, httpx (with
#: rich, which its command line brings) for the processes that query Prometheus or relay to
#: an endpoint: 0.80 → 0.67 s of CPU here without them (issue 31).
NOT_AT_STARTUP = (
    "drf_spectacular.plumbing",
    "django.test",
    "jinja2",
    "identity.oidc",
    "jwt",
    "rest_framework.fields",
    "httpx",
)

PROBE = (
    "import json, sys, django; django.setup(); "
    f"print(json.dumps([name for name in {list(NOT_AT_STARTUP)!r} if name in sys.modules]))"
)


def test_start_up_does_not_load_what_only_the_api_schema_needs(tmp_path: Path) -> None:
    assert probe(PROBE, tmp_path) == []
