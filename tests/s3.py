"""The suite's S3 store: the real SeaweedFS that ``deploy/dev/test_services.py`` starts (its S3
gateway on 127.0.0.1, a bucket and keys made for the session), never a mock of S3.

:func:`s3_service` is the server as the environment names it; a test that needs it fails when
it is not there, with what to run (never a skip: CI must not pass without it).
:func:`s3_store` points the catalog's store at the bucket under a prefix of the test's own,
with the keys in files as production gives them (``TAU_STORAGE_ACCESS_KEY_ID_FILE``, read by
the settings into ``TAU_STORAGE_ACCESS_KEY_ID``), and this machine's folder (upload pieces,
the cache of copies) in the test's temporary folder.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


@dataclass(frozen=True)
class S3Service:
    endpoint: str
    access_key: str
    secret_key: str
    bucket: str

    def client(self, *, access_key: str | None = None, secret_key: str | None = None) -> S3Client:
        from catalog.storage import s3_client

        return s3_client(
            endpoint_url=self.endpoint,
            region="us-east-1",
            access_key_id=access_key or self.access_key,
            secret_access_key=secret_key or self.secret_key,
        )


@dataclass(frozen=True)
class S3Prefix:
    """The part of the bucket one test's store uses: ``s3://<bucket>/<prefix>``."""

    service: S3Service
    prefix: str
    client: S3Client

    @property
    def url(self) -> str:
        return f"s3://{self.service.bucket}/{self.prefix}"

    def object_keys(self) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.service.bucket, Prefix=self.prefix + "/"
        )
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


@pytest.fixture(scope="session")
def s3_service() -> S3Service:
    missing = os.environ.get("TAU_TEST_S3_MISSING")
    if missing:
        pytest.fail(missing, pytrace=False)
    names = ("ENDPOINT", "ACCESS_KEY", "SECRET_KEY", "BUCKET")
    values = [os.environ.get(f"TAU_TEST_S3_{name}", "") for name in names]
    if not all(values):
        pytest.fail(
            "No S3 store for the tests: run them under deploy/dev/test_services.py (`make test` "
            "does), which starts SeaweedFS once `.venv/bin/python deploy/cluster/controlplane.py "
            "build weed` has built it, or set TAU_TEST_S3_ENDPOINT, _ACCESS_KEY, _SECRET_KEY and "
            "_BUCKET.",
            pytrace=False,
        )
    return S3Service(*values)


@pytest.fixture
def s3_store(s3_service: S3Service, settings: Any, tmp_path: Path) -> Iterator[S3Prefix]:
    """The catalog's store is the test bucket under a prefix of this test's own; its objects
    are deleted afterwards."""
    prefix = f"tests/{uuid.uuid4().hex}"
    var = tmp_path / "var"
    var.mkdir()
    settings.VAR_DIR = var
    settings.TAU_STORAGE_URL = f"s3://{s3_service.bucket}/{prefix}"
    settings.TAU_STORAGE_ENDPOINT_URL = s3_service.endpoint
    settings.TAU_STORAGE_REGION = "us-east-1"
    settings.TAU_STORAGE_ACCESS_KEY_ID = s3_service.access_key
    settings.TAU_STORAGE_SECRET_ACCESS_KEY = s3_service.secret_key
    client = s3_service.client()
    store = S3Prefix(s3_service, prefix, client)
    yield store
    for key in store.object_keys():
        client.delete_object(Bucket=s3_service.bucket, Key=key)
