"""A version from a URL (issue 33, ``catalog.url_ingest``): ``POST …/versions/`` with
``source: url`` checks the URL at once (the webhook rules: nothing private, no metadata
service, not the portal), then a task downloads the one file from a real HTTP server on
loopback, redirects followed to checked addresses only, within the file limit and the quota,
and the version is ready with the file's digest, or failed saying why, nothing kept."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from catalog import storage, tasks, url_ingest
from catalog.ingest import asset_named
from catalog.models import AssetVersion
from identity import tokens

pytestmark = pytest.mark.django_db

BODY = b'{"text": "a review"}\n' * 1000
API = "/api/v1/workspaces/alpha/datasets"


@pytest.fixture
def server() -> Iterator[str]:
    """A file server on loopback with the answers a download meets."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/data/reviews.jsonl":
                self._send(200, BODY)
            elif path == "/moved":
                self._redirect("/data/reviews.jsonl")
            elif path == "/to-metadata":
                self._redirect("http://169.254.169.254/latest/meta-data/")
            elif path == "/loop":
                self._redirect("/loop")
            elif path == "/short":
                self.send_response(200)
                self.send_header("Content-Length", "5000")
                self.end_headers()
                self.wfile.write(BODY[:100])
            elif path == "/unsized":
                self.send_response(200)
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(BODY)
                self.close_connection = True
            else:
                self._send(404, b"no such file")

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _redirect(self, location: str) -> None:
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def on_loopback(settings: Any, tmp_path: Path) -> Any:
    """This installation fetches from its own network on purpose (the test server)."""
    settings.TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    settings.VAR_DIR = tmp_path / "var"
    return settings


def start(world: Any, body: dict[str, Any], captured: Any) -> Any:
    api = world.api_client_for("researcher")
    api.post(f"{API}/", {"name": "reviews"}, format="json")
    with captured() as callbacks:
        response = api.post(f"{API}/reviews/versions/", body, format="json")
    return response, callbacks


def test_a_url_becomes_a_ready_version_of_its_one_file(
    world: Any, server: str, on_loopback: Any, django_capture_on_commit_callbacks: Any
) -> None:
    response, callbacks = start(
        world,
        {"source": "url", "url": f"{server}/moved?signature=secret"},
        django_capture_on_commit_callbacks,
    )
    assert response.status_code == 201, response.json()
    answer = response.json()
    assert (answer["state"], answer["source"]) == ("ingesting", "url")
    assert len(callbacks) == 1  # the download is queued once the version is written
    version = AssetVersion.objects.for_workspace(world.alpha).get(number=answer["number"])
    # Kept and shown without its query (a signature is a credential).
    assert version.source_detail == f"{server}/moved"

    assert tasks.ingest_url(version.pk, f"{server}/moved?signature=secret", "reviews.jsonl") == (
        "ready"
    )
    version.refresh_from_db()
    sha = hashlib.sha256(BODY).hexdigest()
    assert (version.state, version.files_count, version.bytes) == ("ready", 1, len(BODY))
    assert list(version.files.values_list("path", "sha256")) == [("reviews.jsonl", sha)]
    with storage.open_blob(world.alpha.pk, sha) as kept:
        assert kept.read() == BODY
    shown = world.api_client_for("viewer").get(f"{API}/reviews/versions/1/").json()
    assert (shown["state"], shown["progress"]["bytes_done"]) == ("ready", len(BODY))
    # Nothing left on the portal's disk.
    assert not list((on_loopback.VAR_DIR / "uploads" / "url").iterdir())


def test_a_download_without_a_length_and_a_path_given(
    world: Any, server: str, on_loopback: Any
) -> None:
    from catalog import url_ingest

    version, _ = url_ingest.start(
        asset_named(world.alpha, "dataset", "reviews"), f"{server}/unsized", path="raw/r.jsonl"
    )
    tasks.ingest_url(version.pk, f"{server}/unsized", "raw/r.jsonl")
    version.refresh_from_db()
    assert version.state == "ready", version.error
    assert list(version.files.values_list("path", "size")) == [("raw/r.jsonl", len(BODY))]


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/missing.jsonl", "/missing.jsonl answered 404 Not Found; nothing was kept."),
        ("/short", "/short sent 100 of the 5,000 bytes it announced."),
        ("/loop", "More than 5 redirects; give the file's final URL."),
        ("/to-metadata", "169.254.169.254"),
    ],
)
def test_a_download_that_goes_wrong_fails_the_version_saying_why(
    world: Any, server: str, on_loopback: Any, path: str, error: str
) -> None:
    from catalog import url_ingest

    version, _ = url_ingest.start(asset_named(world.alpha, "dataset", "reviews"), f"{server}{path}")
    tasks.ingest_url(version.pk, f"{server}{path}", "file")
    version.refresh_from_db()
    assert version.state == "failed"
    assert error in version.error
    assert not version.files.exists()


def test_a_file_over_the_limit_or_the_quota_is_refused_before_it_is_read(
    world: Any, server: str, on_loopback: Any
) -> None:
    from catalog import url_ingest

    asset = asset_named(world.alpha, "dataset", "reviews")
    on_loopback.TAU_DATA_MAX_FILE_BYTES = 1000
    version, _ = url_ingest.start(asset, f"{server}/data/reviews.jsonl")
    tasks.ingest_url(version.pk, f"{server}/data/reviews.jsonl", "reviews.jsonl")
    version.refresh_from_db()
    assert version.state == "failed"
    assert f"reviews.jsonl is {len(BODY):,} bytes, more than the 1,000" in version.error
    assert version.bytes_done == 0

    on_loopback.TAU_DATA_MAX_FILE_BYTES = 10**9
    world.alpha.storage_quota_bytes = 100
    world.alpha.save(update_fields=["storage_quota_bytes"])
    version, _ = url_ingest.start(asset, f"{server}/data/reviews.jsonl")
    tasks.ingest_url(version.pk, f"{server}/data/reviews.jsonl", "reviews.jsonl")
    version.refresh_from_db()
    assert version.state == "failed"
    assert "storage quota" in version.error


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("ftp://example.org/x", "must start with https://"),
        ("https://user:pw@example.org/x", "may not hold a user name or password"),
        ("http://169.254.169.254/latest/meta-data/x", "169.254.169.254"),
        ("http://127.0.0.1:9/x", "loopback"),
        ("https://example.org/", "ends in no file name"),
    ],
)
def test_a_url_the_portal_will_not_fetch_is_refused_at_once_and_makes_nothing(
    world: Any, settings: Any, url: str, said: str
) -> None:
    settings.TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    api = world.api_client_for("researcher")
    api.post(f"{API}/", {"name": "reviews"}, format="json")
    response = api.post(f"{API}/reviews/versions/", {"source": "url", "url": url}, format="json")
    assert response.status_code == 400
    assert said in str(response.json()), response.json()
    assert not AssetVersion.objects.for_workspace(world.alpha).exists()


@pytest.fixture
def portal(tmp_path: Path, settings: Any) -> Iterator[Any]:
    """The portal's web server and Celery worker, fetching from loopback on purpose."""
    from tests.runs.processes import portal_processes

    store = f"file://{tmp_path / 'store'}"
    settings.TAU_STORAGE_URL = store
    env = {"TAU_STORAGE_URL": store, "TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "1"}
    yield from portal_processes(tmp_path, settings.CELERY_BROKER_URL, extra_env=env)


@pytest.mark.django_db(transaction=True)
def test_tau_ingests_a_url_through_the_portals_own_worker(
    world: Any, server: str, tmp_path: Path, portal: Any
) -> None:
    """End to end: `tau data dataset ingest NAME URL` asks the portal (gunicorn), whose Celery
    worker downloads the file; the CLI follows the progress to ready."""
    from tests.cli.test_cli_members import Tau

    portal.start(beat=False)
    token = tokens.issue_token(user=world.users["researcher"], name="cli").plaintext
    tau = Tau(portal.url, token, tmp_path / "home")
    done = tau("data", "dataset", "ingest", "reviews", f"{server}/data/reviews.jsonl")
    assert done.returncode == 0, done.stdout + done.stderr + portal.log("worker")[-2000:]
    assert "The portal is downloading reviews@1." in done.stdout
    assert "reviews@1: ready, 1 files," in done.stdout
    shown = tau.json("data", "dataset", "show", "reviews@1")
    assert shown["source"] == "url"
    refused = tau("data", "dataset", "ingest", "reviews", "http://169.254.169.254/x")
    assert refused.returncode != 0
    assert "169.254.169.254" in refused.stdout + refused.stderr


def test_a_version_the_sweep_failed_meanwhile_keeps_the_sweeps_word(
    world: Any, server: str, on_loopback: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """A worker the sweep took for dead (no progress for TAU_DATA_STALE_SECONDS) and that
    then finishes its download, or fails, changes nothing: the version stays as the sweep
    left it, neither made ready nor failed a second time with another reason."""
    response, _ = start(
        world, {"source": "url", "url": f"{server}/moved"}, django_capture_on_commit_callbacks
    )
    version = AssetVersion.objects.for_workspace(world.alpha).get(number=response.json()["number"])
    swept = "Its ingest stopped (the process making it ended) after 0 bytes."
    for url in (f"{server}/moved", f"{server}/missing.jsonl"):  # one ends well, one does not
        AssetVersion.objects.for_workspace(world.alpha).filter(pk=version.pk).update(
            state="failed", error=swept
        )
        url_ingest.download(version, url, "reviews.jsonl")  # it still thinks it is ingesting
        version.refresh_from_db()
        assert (version.state, version.error, version.files_count) == ("failed", swept, 0)
        assert not version.files.exists()
        version.state = "ingesting"
