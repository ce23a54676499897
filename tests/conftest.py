"""Shared fixtures: a fixed cast of users around two workspaces, used by every test module."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import Client
from rest_framework.test import APIClient

from portal import rate_limits
from tests.scripts import load_script
from workspaces.models import (
    Cohort,
    Membership,
    PriorityClass,
    ResourceFlavor,
    Role,
    Workspace,
    WorkspaceQuota,
)

pytest_plugins = [
    "tests.browser",
    "tests.cluster.plugin",
    "tests.executors.local.plugin",
    "tests.s3",
    "tests.telemetry.plugin",
    "tests.tiers",
]

_MINUTES = itertools.count()
#: Under pytest-xdist each worker (gw0, gw1, …) counts its windows in a range of its own.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
#: ``make test`` runs the cluster tier in a session of its own beside the others (its lane,
#: deploy/dev/test_lanes.py), on the same PostgreSQL and Redis: a lane has test databases of
#: its own, and a Redis database of its own (set by the script) for the cache and Celery.
LANE = os.environ.get("TAU_TEST_LANE", "")
lanes = load_script(
    Path(__file__).resolve().parents[1] / "deploy" / "dev" / "test_lanes.py", "taugrid_test_lanes"
)
#: The Redis databases xdist workers get (Redis has 16: 0 and 1 are taken).
FIRST_WORKER_DATABASE = 2
WORKER_DATABASES = 14


def worker_database(broker: str, worker: str, lane: str = LANE) -> str:
    """The Redis URL of pytest-xdist worker ``worker`` (``gw0`` …), for the session's
    ``broker``: database 2 for gw0, 3 for gw1, … (0 is the session's, 1 the cluster lane's);
    in the fast lane, which may run beside the others (deploy/dev/test_lanes.py), 9 for gw0,
    10 for gw1, …: each lane has half of them. Any other broker unchanged."""
    half = WORKER_DATABASES // 2
    first = FIRST_WORKER_DATABASE + (half if lane == "fast" else 0)
    number = first + int(worker.removeprefix("gw")) % half
    own: str = lanes.in_database(broker, number)
    return own


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, a Redis database for each worker (:func:`worker_database`):
    Celery's queues are per database, so the portal processes a test starts on the session's
    broker never run another worker's tasks (against another test database, where their rows
    do not exist), and the cache is the worker's own too."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    from django.conf import settings as django_settings

    from portal.celery import app

    broker = django_settings.CELERY_BROKER_URL
    own = worker_database(broker, worker)
    if own == broker:
        return
    cache = django_settings.CACHES["default"]
    if cache.get("LOCATION") == broker:
        cache["LOCATION"] = own
    django_settings.CELERY_BROKER_URL = own
    app.conf.update(broker_url=own)
    # Celery reads the variable before its settings; programs the tests start inherit it.
    for variable in lanes.REDIS_SETTINGS:
        if os.environ.get(variable) == broker:
            os.environ[variable] = own


@pytest.fixture(scope="session", autouse=True)
def own_var_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This test process's ``VAR_DIR`` (the catalog's store, bundles, artifacts, endpoints'
    folders: where a test that names no folder of its own keeps files), its own: not the
    checkout's ``var/`` (``make run``'s), nor another pytest-xdist worker's or lane's. Each
    of those has a database of its own, where a workspace has the id another's has, and the
    store is kept by workspace id: one worker's dataset DELETE removed the blob another's run
    was reading (``test_access[api:run-data-blob-*]`` answered 404 under ``-n 2``).

    Under the session's temporary folder (``popen-gw0/var`` …, kept with the last few
    sessions'). Settings made at import from the checkout's ``var/`` stay (the secrets, the
    evidence key's path); the metrics token is copied where ``/metrics`` says it is."""
    from django.conf import settings as django_settings

    own = tmp_path_factory.mktemp("var", numbered=False)
    before = Path(django_settings.VAR_DIR)
    if (before / "metrics-token").exists():
        (own / "metrics-token").write_bytes((before / "metrics-token").read_bytes())
        (own / "metrics-token").chmod(0o600)
    django_settings.VAR_DIR = own
    yield own
    django_settings.VAR_DIR = before


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """pytest-django's names (``test_taugrid``, ``_gw0`` under xdist), with the lane's name."""
    if not LANE:
        return
    from django.conf import settings as django_settings

    databases: dict[str, dict[str, Any]] = django_settings.DATABASES
    for database in databases.values():
        if database["ENGINE"] == "django.db.backends.sqlite3":
            continue
        test: dict[str, Any] = database.setdefault("TEST", {})
        test["NAME"] = f"{test.get('NAME') or 'test_' + database['NAME']}_{LANE}"


@pytest.fixture(autouse=True)
def one_minute_of_rate_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test's requests fall in one fixed window of the portal's rate limits, a window
    no other test of the session uses: a test that straddled a minute boundary would see its
    count start again (``test_reports_are_rate_limited_per_run_token`` did, in CI), and one
    that shared a window with the test before it would inherit its count. Parallel workers
    share the cache, so each has its own range of windows."""
    frozen = 1_800_000_000.0 + 60 * (1_000_000 * _WORKER + next(_MINUTES)) + 30
    monkeypatch.setattr(rate_limits, "clock", lambda: frozen)


CAST = ("platform_admin", "workspace_admin", "researcher", "viewer", "outsider", "anonymous")


@dataclass
class World:
    """Workspace ``alpha`` with an admin, a researcher and a viewer; ``beta`` with the
    outsider (who is therefore a real user of the platform, only not of ``alpha``)."""

    alpha: Workspace
    beta: Workspace
    users: dict[str, Any]
    gpu_flavor: ResourceFlavor
    cohort: Cohort

    def client_for(self, who: str) -> Client:
        client = Client()
        user = self.users[who]
        if user is not None:
            client.force_login(user)
        return client

    def api_client_for(self, who: str) -> APIClient:
        client = APIClient()
        user = self.users[who]
        if user is not None:
            client.force_authenticate(user)
        return client


def make_workspace(slug: str, **extra: Any) -> Workspace:
    defaults: dict[str, Any] = {
        "name": slug.title(),
        "namespace": f"tau-{slug}",
        "local_queue": slug,
    }
    defaults.update(extra)
    return Workspace.unscoped_objects.create(slug=slug, **defaults)


@pytest.fixture
def world(django_user_model: Any) -> World:
    return build_world(django_user_model)


@pytest.fixture(scope="module")
def module_world(django_db_setup: None, django_db_blocker: Any) -> Iterator[World]:
    """The cast of :class:`World`, made once for a module inside a transaction of its own (as
    Django's ``setUpTestData`` does): each test runs in a savepoint inside it, rolled back at
    the test's end as always, so what a test writes (a run, a token, a membership) is gone
    before the next; the cast itself goes when the module ends. For modules of many cases
    (tests/test_access_matrix.py, tests/test_api_schema.py: the cast was a quarter to a third
    of their time), which name it their ``world`` (``world = module_world`` as a fixture).
    Only where no test changes the cast's objects in memory and nothing outside the database
    is keyed by their ids (rate limits count in each test's own window,
    ``one_minute_of_rate_limits``; run names are random)."""
    with django_db_blocker.unblock():
        cast = transaction.atomic()
        cast.__enter__()
        try:
            made = build_world(get_user_model())
        except BaseException:
            cast.__exit__(None, None, None)
            raise
    try:
        yield made
    finally:
        with django_db_blocker.unblock():
            transaction.set_rollback(True)
            cast.__exit__(None, None, None)


def build_world(django_user_model: Any) -> World:
    """The cast of :class:`World`, made in the database (what the ``world`` fixture gives)."""

    def user(username: str, **flags: Any) -> Any:
        created = django_user_model.objects.create_user(
            username=username, password=None, email=f"{username}@example.org", **flags
        )
        return created

    cohort = Cohort.objects.create(name="research")
    gpu = ResourceFlavor.objects.create(
        name="h100",
        gpu_model="NVIDIA-H100-80GB-HBM3",
        node_labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    )
    # A workspace's allowed priorities name priority classes (one value cluster-wide).
    PriorityClass.objects.create(name="normal", value=1000)
    alpha = make_workspace("alpha", cohort=cohort, allowed_priorities=["normal"])
    beta = make_workspace("beta")
    users: dict[str, Any] = {
        "platform_admin": user("platform", is_staff=True, is_superuser=True),
        "workspace_admin": user("alice"),
        "researcher": user("rob"),
        "viewer": user("vera"),
        "outsider": user("otto"),
        "anonymous": None,
    }
    Membership.objects.create(workspace=alpha, user=users["workspace_admin"], role=Role.ADMIN)
    Membership.objects.create(workspace=alpha, user=users["researcher"], role=Role.RESEARCHER)
    Membership.objects.create(workspace=alpha, user=users["viewer"], role=Role.VIEWER)
    Membership.objects.create(workspace=beta, user=users["outsider"], role=Role.ADMIN)
    WorkspaceQuota.objects.create(
        workspace=alpha, flavor=gpu, resource="nvidia.com/gpu", nominal=Decimal(8)
    )
    WorkspaceQuota.objects.create(
        workspace=beta, flavor=gpu, resource="nvidia.com/gpu", nominal=Decimal(4)
    )
    return World(alpha=alpha, beta=beta, users=users, gpu_flavor=gpu, cohort=cohort)
