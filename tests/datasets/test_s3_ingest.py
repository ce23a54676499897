"""Versions from S3 (issue 33, ``catalog.s3_ingest``), against the suite's real S3 server
(SeaweedFS, tests/s3.py): ``POST …/versions/`` with ``source: url`` and ``s3://bucket/key``
(one object) or ``s3://bucket/prefix/`` (every object under it) is checked at once — a bucket
the platform team did not list, another workspace's area, the portal's own store, a key with
``..``, a host in place of a bucket are refused and make nothing — then a task reads the
objects into the workspace's store: ready with the manifest of what was listed, or failed
naming the key (a missing object, a bucket that is not there, a key no version may hold, an
object changed after it was listed), the quota and the limits refused before a byte is read."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalog import s3_ingest, storage, tasks, url_ingest
from catalog.ingest import asset_named
from catalog.models import AssetVersion
from identity import tokens
from tau.manifest import Entry, Manifest
from tests.s3 import S3Prefix, S3Service

pytestmark = [pytest.mark.django_db, pytest.mark.services]

API = "/api/v1/workspaces/alpha/datasets"
FILES = {
    "a.txt": b"alpha\n",
    "sub/b.txt": b"beta\n" * 1000,
    "copy-of-a.txt": b"alpha\n",
    "empty": b"",
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_of(files: dict[str, bytes], under: str = "") -> Manifest:
    return Manifest.of(
        Entry(f"{under}{path}", len(data), sha(data)) for path, data in files.items()
    )


class Sources:
    """Objects of the test's own under ``sources/<id>/`` of the suite's bucket; the platform
    lets each workspace read ``sources/<id>/<its slug>/``."""

    def __init__(self, service: S3Service) -> None:
        self.service = service
        self.bucket = service.bucket
        self.root = f"sources/{uuid.uuid4().hex}"
        self.client = service.client()
        self.keys: list[str] = []

    def put(self, key: str, data: bytes) -> str:
        """The object ``<root>/<key>``, its s3:// URL."""
        full = f"{self.root}/{key}"
        self.client.put_object(Bucket=self.bucket, Key=full, Body=data)
        self.keys.append(full)
        return f"s3://{self.bucket}/{full}"

    def put_files(self, under: str, files: dict[str, bytes]) -> str:
        for path, data in files.items():
            self.put(f"{under}{path}", data)
        return f"s3://{self.bucket}/{self.root}/{under}"

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.root}/{key}"


@pytest.fixture
def sources(s3_service: S3Service, settings: Any) -> Iterator[Sources]:
    found = Sources(s3_service)
    settings.TAU_DATA_SOURCE_BUCKETS = [f"{found.bucket}/{found.root}/{{workspace}}/"]
    yield found
    for key in found.keys:
        found.client.delete_object(Bucket=found.bucket, Key=key)


def post(world: Any, body: dict[str, Any], captured: Any) -> tuple[Any, list[Any]]:
    api = world.api_client_for("researcher")
    api.post(f"{API}/", {"name": "reviews"}, format="json")
    with captured() as callbacks:
        response = api.post(f"{API}/reviews/versions/", body, format="json")
    return response, callbacks


def started(world: Any, url: str, path: str | None = None) -> tuple[AssetVersion, str]:
    return url_ingest.start(asset_named(world.alpha, "dataset", "reviews"), url, path=path)


def read(version: AssetVersion, url: str, name: str) -> AssetVersion:
    tasks.ingest_url(version.pk, url, name)
    version.refresh_from_db()
    return version


def test_one_object_becomes_a_ready_version(
    world: Any,
    s3_store: S3Prefix,
    sources: Sources,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    data = b'{"text": "a review"}\n' * 1000
    url = sources.put("alpha/raw/reviews.jsonl", data)
    response, callbacks = post(
        world, {"source": "url", "url": url}, django_capture_on_commit_callbacks
    )
    assert response.status_code == 201, response.json()
    answer = response.json()
    assert (answer["state"], answer["source"]) == ("ingesting", "url")
    assert len(callbacks) == 1  # queued once the version is written
    version = AssetVersion.objects.for_workspace(world.alpha).get(number=answer["number"])
    assert version.source_detail == url

    assert tasks.ingest_url(version.pk, url, "") == "ready"
    version.refresh_from_db()
    assert (version.state, version.error, version.files_count) == ("ready", "", 1)
    assert list(version.files.values_list("path", "sha256")) == [("reviews.jsonl", sha(data))]
    assert version.manifest_digest == manifest_of({"reviews.jsonl": data}).digest
    with storage.open_blob(world.alpha.pk, sha(data)) as kept:
        assert kept.read() == data
    shown = world.api_client_for("viewer").get(f"{API}/reviews/versions/1/").json()
    progress = shown["progress"]
    assert (progress["bytes_done"], progress["bytes_total"]) == (len(data), len(data))
    # The same task again (a redelivery) finds the version made and leaves it be.
    assert tasks.ingest_url(version.pk, url, "") == "gone"
    # Nothing left on the portal's disk.
    assert not list((Path(settings.VAR_DIR) / "uploads" / "s3").iterdir())


def test_a_prefix_of_several_objects_becomes_a_ready_version(
    world: Any, s3_store: S3Prefix, sources: Sources
) -> None:
    url = sources.put_files("alpha/data/", FILES)
    sources.put("alpha/data/sub/", b"")  # a console's folder marker: no file
    sources.put("alpha/data-other.txt", b"not under data/")
    version, name = started(world, url)
    version = read(version, url, name)
    assert (version.state, version.error) == ("ready", "")
    assert version.manifest_digest == manifest_of(FILES).digest
    assert (version.files_count, version.bytes) == (4, sum(map(len, FILES.values())))
    # Each distinct file once in the workspace's store.
    blobs = {key.rsplit("/", 1)[-1] for key in s3_store.object_keys()}
    assert blobs == {sha(data) for data in FILES.values()}

    # Without its trailing slash the key names no object, so the prefix is read; under a path.
    again, name = started(world, url.rstrip("/"), path="raw/")
    again = read(again, url.rstrip("/"), name)
    assert again.state == "ready", again.error
    assert again.manifest_digest == manifest_of(FILES, under="raw/").digest


def test_a_store_in_a_folder_reads_sources_from_the_service_set_for_them(
    world: Any, s3_service: S3Service, sources: Sources, settings: Any, tmp_path: Path
) -> None:
    """TAU_DATA_SOURCE_*: another S3 service than the store's (here the store is a folder, so
    it has none)."""
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"
    settings.VAR_DIR = tmp_path / "var"
    settings.TAU_STORAGE_ENDPOINT_URL = ""
    settings.TAU_DATA_SOURCE_ENDPOINT_URL = s3_service.endpoint
    settings.TAU_DATA_SOURCE_REGION = "us-east-1"
    settings.TAU_DATA_SOURCE_ACCESS_KEY_ID = s3_service.access_key
    settings.TAU_DATA_SOURCE_SECRET_ACCESS_KEY = s3_service.secret_key
    url = sources.put_files("alpha/data/", FILES)
    version, name = started(world, url, path="data")
    version = read(version, url, name)
    assert version.state == "ready", version.error
    assert version.manifest_digest == manifest_of(FILES, under="data/").digest
    assert storage.blob_path(world.alpha.pk, sha(b"beta\n" * 1000)).read_bytes() == (
        b"beta\n" * 1000
    )

    # Wrong source keys: refused, saying which settings to check, no key shown.
    settings.TAU_DATA_SOURCE_SECRET_ACCESS_KEY = "wrong-secret"
    version, name = started(world, url)
    version = read(version, url, name)
    assert version.state == "failed"
    assert "TAU_DATA_SOURCE_ACCESS_KEY_ID_FILE" in version.error
    assert "wrong-secret" not in version.error
    assert s3_service.access_key not in version.error


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("beta/data/a.txt", "is not in what alpha may read"),
        ("alpha/../beta/data/a.txt", "points outside the folder"),
        ("alpha/./data/a.txt", "empty or '.' part"),
        ("alpha//data/a.txt", "empty or '.' part"),
    ],
)
def test_a_key_outside_the_workspaces_area_is_refused_at_once(
    world: Any,
    s3_store: S3Prefix,
    sources: Sources,
    django_capture_on_commit_callbacks: Any,
    key: str,
    said: str,
) -> None:
    sources.put("beta/data/a.txt", b"beta's\n")
    response, callbacks = post(
        world, {"source": "url", "url": sources.url(key)}, django_capture_on_commit_callbacks
    )
    assert response.status_code == 400
    assert said in str(response.json()), response.json()
    assert callbacks == []
    assert not AssetVersion.objects.for_workspace(world.alpha).exists()


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("s3://another-bucket/data/a.txt", "is not in what alpha may read"),
        ("s3://user@127.0.0.1:9000/a.txt", "is not a bucket's name"),
        ("s3://169.254.169.254/latest/meta-data", "is not in what alpha may read"),
        ("s3://Bucket_Name/a.txt", "is not a bucket's name"),
        ("s3:///a.txt", "is not a bucket's name"),
    ],
)
def test_a_bucket_the_platform_did_not_list_is_refused_at_once(
    world: Any, s3_store: S3Prefix, sources: Sources, url: str, said: str
) -> None:
    with pytest.raises(s3_ingest.S3SourceRefused, match=said):
        started(world, url)
    assert not AssetVersion.objects.for_workspace(world.alpha).exists()


def test_the_portals_own_store_is_never_a_source(
    world: Any, s3_store: S3Prefix, sources: Sources, settings: Any
) -> None:
    """Even where the platform lets every workspace read the whole bucket the store is in,
    the store's area (every workspace's files) is refused, and so is a prefix that holds it."""
    beta_blob = sha(b"beta's secret\n")
    storage.write_blob(world.beta.pk, _file(settings, b"beta's secret\n"), name="secret")
    settings.TAU_DATA_SOURCE_BUCKETS = [sources.bucket]
    bucket = sources.bucket
    for url in (
        f"s3://{bucket}/{s3_store.prefix}/workspaces/{world.beta.pk}/blobs/{beta_blob[:2]}/"
        f"{beta_blob}",
        f"s3://{bucket}/{s3_store.prefix}/workspaces/{world.alpha.pk}/",
        f"s3://{bucket}/{s3_store.prefix}",
        f"s3://{bucket}/tests/",
        f"s3://{bucket}/",
        f"s3://{bucket}",
    ):
        with pytest.raises(s3_ingest.S3SourceRefused, match="the portal's own store"):
            started(world, url)
    # Data beside the store in the same bucket is readable when listed.
    data = sources.put("alpha/a.txt", b"alpha\n")
    version, name = started(world, data)
    assert read(version, data, name).state == "ready"


def _file(settings: Any, data: bytes) -> Path:
    path = Path(settings.VAR_DIR) / f"file-{uuid.uuid4().hex}"
    path.write_bytes(data)
    return path


def test_without_a_list_of_buckets_nothing_is_read(
    world: Any, s3_store: S3Prefix, sources: Sources, settings: Any
) -> None:
    settings.TAU_DATA_SOURCE_BUCKETS = []
    with pytest.raises(s3_ingest.S3SourceRefused, match="TAU_DATA_SOURCE_BUCKETS"):
        started(world, sources.put("alpha/a.txt", b"alpha\n"))


def test_what_goes_wrong_while_reading_fails_the_version_naming_the_key(
    world: Any, s3_store: S3Prefix, sources: Sources, settings: Any
) -> None:
    missing = sources.url("alpha/missing.jsonl")
    version, name = started(world, missing)
    version = read(version, missing, name)
    assert version.state == "failed"
    assert version.error == (f"{missing}: no such object, nor any under {missing}/.")
    assert not version.files.exists()

    empty = sources.url("alpha/nothing/")
    version, name = started(world, empty)
    assert read(version, empty, name).error == f"{empty}: there is no object under it."

    settings.TAU_DATA_SOURCE_BUCKETS = ["no-such-bucket-here"]
    version, name = started(world, "s3://no-such-bucket-here/data/")
    version = read(version, "s3://no-such-bucket-here/data/", name)
    assert "s3://no-such-bucket-here/data/: the S3 service http" in version.error
    assert "has no such bucket" in version.error

    # A key under the prefix that no version may hold as a path (a hidden character).
    settings.TAU_DATA_SOURCE_BUCKETS = [f"{sources.bucket}/{sources.root}/{{workspace}}/"]
    sources.put("alpha/tricky/ok.txt", b"fine\n")
    sneaky = sources.put("alpha/tricky/invoice\u202etxt.exe", b"boo\n")
    version, name = started(world, sources.url("alpha/tricky/"))
    version = read(version, sources.url("alpha/tricky/"), name)
    assert version.state == "failed"
    assert version.error.startswith(f"{sneaky} cannot be a file of a version:")
    assert version.bytes_done == 0  # refused before a byte was read


def test_the_limits_and_the_quota_refuse_a_listing_before_a_byte_is_read(
    world: Any, s3_store: S3Prefix, sources: Sources, settings: Any
) -> None:
    url = sources.put_files("alpha/data/", FILES)
    big = sources.url("alpha/data/sub/b.txt")

    settings.TAU_DATA_MAX_FILES = 3
    version, name = started(world, url)
    assert read(version, url, name).error == (
        f"{url} holds more than 3 objects, more than a version may hold (TAU_DATA_MAX_FILES)."
    )
    settings.TAU_DATA_MAX_FILES = 100

    settings.TAU_DATA_MAX_FILE_BYTES = 1000
    version, name = started(world, url)
    assert read(version, url, name).error == (
        f"{big} is 5,000 bytes, more than the 1,000 a file may have here (TAU_DATA_MAX_FILE_BYTES)."
    )
    settings.TAU_DATA_MAX_FILE_BYTES = 10**9

    world.alpha.storage_quota_bytes = 100
    world.alpha.save(update_fields=["storage_quota_bytes"])
    version, name = started(world, url)
    version = read(version, url, name)
    assert version.state == "failed"
    assert "needs 5,012 more bytes" in version.error
    assert "storage quota" in version.error
    assert (version.bytes_done, version.bytes_total) == (0, 5012)
    assert s3_store.object_keys() == []  # nothing kept


def test_an_object_changed_after_it_was_listed_fails_the_version(
    world: Any, s3_store: S3Prefix, sources: Sources, monkeypatch: Any
) -> None:
    url = sources.put_files("alpha/data/", FILES)
    listed = s3_ingest.list_items

    def list_then_change(*args: Any) -> Any:
        items = listed(*args)
        sources.put("alpha/data/sub/b.txt", b"changed meanwhile\n")
        return items

    monkeypatch.setattr(s3_ingest, "list_items", list_then_change)
    version, name = started(world, url)
    version = read(version, url, name)
    assert version.state == "failed"
    assert version.error == (
        f"{sources.url('alpha/data/sub/b.txt')} changed while it was read; ask for the "
        "version again."
    )


def test_a_version_the_sweep_failed_meanwhile_is_not_made_ready(
    world: Any, s3_store: S3Prefix, sources: Sources
) -> None:
    url = sources.put("alpha/a.txt", b"alpha\n")
    version, name = started(world, url)
    AssetVersion.objects.for_workspace(world.alpha).filter(pk=version.pk).update(
        state="failed", error="Its ingest stopped"
    )
    s3_ingest.ingest(version, url, name)
    version.refresh_from_db()
    assert (version.state, version.error) == ("failed", "Its ingest stopped")


def test_many_objects_larger_than_the_spool_are_read_in_order(
    world: Any, s3_store: S3Prefix, sources: Sources, monkeypatch: Any
) -> None:
    """More objects than are fetched at once, some larger than the bytes held ahead: each
    lands at its own path (the look-ahead keeps them in order)."""
    monkeypatch.setattr(s3_ingest, "SPOOL_BYTES", 3000)
    files = {f"part-{index:02}.bin": bytes([index]) * (500 * index) for index in range(1, 12)}
    url = sources.put_files("alpha/parts/", files)
    version, name = started(world, url)
    version = read(version, url, name)
    assert version.state == "ready", version.error
    assert version.manifest_digest == manifest_of(files).digest


@pytest.fixture
def portal(tmp_path: Path, settings: Any, s3_store: S3Prefix, sources: Sources) -> Iterator[Any]:
    """The portal's web server and Celery worker, its store and sources in the S3 server."""
    from tests.runs.processes import portal_processes

    service = s3_store.service
    env = {
        "TAU_STORAGE_URL": s3_store.url,
        "TAU_STORAGE_ENDPOINT_URL": service.endpoint,
        "TAU_STORAGE_REGION": "us-east-1",
        "TAU_STORAGE_ACCESS_KEY_ID": service.access_key,
        "TAU_STORAGE_SECRET_ACCESS_KEY": service.secret_key,
        "TAU_DATA_SOURCE_BUCKETS": f"{sources.bucket}/{sources.root}/{{workspace}}/",
    }
    yield from portal_processes(tmp_path, settings.CELERY_BROKER_URL, extra_env=env)


@pytest.mark.django_db(transaction=True)
def test_tau_ingests_an_s3_prefix_through_the_portals_own_worker(
    world: Any, tmp_path: Path, sources: Sources, portal: Any
) -> None:
    """End to end: `tau data dataset ingest NAME s3://…/` asks the portal, whose Celery worker
    reads the objects; the CLI follows the progress to ready."""
    from tests.cli.test_cli_members import Tau

    url = sources.put_files("alpha/data/", FILES)
    portal.start(beat=False)
    token = tokens.issue_token(user=world.users["researcher"], name="cli").plaintext
    tau = Tau(portal.url, token, tmp_path / "home")
    done = tau("data", "dataset", "ingest", "reviews", url, "--path", "raw")
    assert done.returncode == 0, done.stdout + done.stderr + portal.log("worker")[-2000:]
    assert "The portal is downloading reviews@1." in done.stdout
    assert "reviews@1: ready, 4 files," in done.stdout
    shown = tau.json("data", "dataset", "show", "reviews@1")
    assert (shown["source"], shown["manifest_digest"]) == (
        "url",
        manifest_of(FILES, under="raw/").digest,
    )
    refused = tau("data", "dataset", "ingest", "reviews", sources.url("beta/data/"))
    assert refused.returncode != 0
    assert "is not in what alpha may read" in refused.stdout + refused.stderr
