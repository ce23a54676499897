"""The catalog's pages (issue 33): a workspace's datasets and models, one of them with its
versions, one version with its progress, files and lineage both ways, and the run page's
Data section; other workspaces' assets are missing, and every page answers in a fixed
number of queries however many rows there are."""

from __future__ import annotations

import hashlib
import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.ingest import asset_named, ingest_folder, set_alias
from catalog.models import AssetVersion, RunInput
from catalog.uploads import start_upload
from tests.datasets.test_catalog import folder
from tests.runs.factories import make_run

pytestmark = pytest.mark.django_db

PAGES = "/w/alpha"


@pytest.fixture(autouse=True)
def store(settings: Any, tmp_path: Path) -> None:
    settings.TAU_STORAGE_URL = f"file://{tmp_path / 'store'}"


def text_of(html: str) -> str:
    """What a person reads: no tags, the words only screen readers get left in."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def section(html: str, heading_id: str) -> str:
    """The HTML of the card whose heading has ``heading_id``."""
    start = html.index(f'id="{heading_id}"')
    return html[start : html.index("</section>", start)]


def get(world: Any, url: str, who: str = "viewer", **headers: str) -> str:
    response = world.client_for(who).get(url, **headers)
    assert response.status_code == 200, (url, response.status_code)
    return str(response.content.decode())


def make_version(world: Any, tmp_path: Path, kind: str, name: str, **extra: Any) -> AssetVersion:
    files = extra.pop("files", {"a.txt": b"alpha\n", "sub/b.txt": b"beta\n"})
    where = folder(tmp_path / f"{kind}-{name}-{len(list(tmp_path.iterdir()))}", files)
    extra.setdefault("source", "upload")
    return ingest_folder(asset_named(world.alpha, kind, name), where, **extra)


def test_the_navigation_names_datasets_and_models_after_runs(world: Any) -> None:
    html = get(world, f"{PAGES}/runs/")
    nav = html[html.index('<nav class="topnav"') : html.index("</nav>")]
    links = re.findall(r'<a href="([^"]+)">([^<]+)</a>', nav)
    names = [name for _, name in links]
    assert names[names.index("Runs") : names.index("Runs") + 3] == ["Runs", "Datasets", "Models"]
    assert (f"{PAGES}/datasets/", "Datasets") in links
    assert (f"{PAGES}/models/", "Models") in links


def test_empty_pages_say_what_to_do(world: Any) -> None:
    datasets = text_of(get(world, f"{PAGES}/datasets/"))
    assert "No datasets yet" in datasets
    assert "Upload a folder with tau data dataset ingest NAME FOLDER" in datasets
    assert "outputs.dataset" in datasets
    models = text_of(get(world, f"{PAGES}/models/"))
    assert "No models yet" in models
    assert "tau data model ingest NAME FOLDER" in models
    assert "tau data model register NAME --run RUN --path PATH" in models
    # A dataset made over the API, nothing sent yet.
    asset_named(world.alpha, "dataset", "empty")
    detail = text_of(get(world, f"{PAGES}/datasets/empty/"))
    assert "No versions yet" in detail
    assert "tau data dataset ingest empty FOLDER" in detail


def test_the_lists_show_each_asset_with_its_latest_ready_version(
    world: Any, tmp_path: Path
) -> None:
    one = make_version(world, tmp_path, "dataset", "wiki", files={"a": b"x" * 2048})
    set_alias(one, "train")
    make_version(world, tmp_path, "dataset", "wiki", files={"b": b"y"})
    start_upload(
        asset_named(world.alpha, "dataset", "wiki"),
        [{"path": "c", "size": 1, "sha256": hashlib.sha256(b"c").hexdigest()}],
    )  # version 3, ingesting
    make_version(world, tmp_path, "model", "bert")
    asset_named(world.alpha, "dataset", "fresh")

    html = get(world, f"{PAGES}/datasets/")
    assert "bert" not in html  # a model
    rows = {
        cells[0]: cells[1:]
        for cells in (
            [text_of(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", html.split("<tbody>")[1], flags=re.S)
        )
    }
    assert list(rows) == ["fresh", "wiki"]  # by name
    latest, files, size, versions, aliases, _updated = rows["wiki"]
    assert (latest, files, size, versions, aliases) == ("wiki@2", "1", "1 byte", "3", "train → 1")
    assert f'href="{PAGES}/datasets/wiki/versions/3/"' not in html  # ingesting
    assert rows["fresh"][0] == "none ready yet"
    assert f'href="{PAGES}/datasets/wiki/"' in html
    models = get(world, f"{PAGES}/models/")
    assert f'href="{PAGES}/models/bert/versions/1/"' in models
    assert "wiki" not in models


def test_the_lists_latest_is_the_newest_ready_version(world: Any, tmp_path: Path) -> None:
    make_version(world, tmp_path, "dataset", "wiki")
    start_upload(
        asset_named(world.alpha, "dataset", "wiki"),
        [{"path": "c", "size": 1, "sha256": hashlib.sha256(b"c").hexdigest()}],
    )
    html = get(world, f"{PAGES}/datasets/")
    assert f'href="{PAGES}/datasets/wiki/versions/1/">wiki@1</a>' in html


def test_the_detail_page_lists_versions_newest_first(world: Any, tmp_path: Path) -> None:
    run = make_run(world)
    one = make_version(world, tmp_path, "dataset", "wiki", source_detail="raw/")
    set_alias(one, "train")
    two = make_version(world, tmp_path, "dataset", "wiki", source="run", produced_by=run)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "link").symlink_to(tmp_path / "nowhere")
    ingest_folder(asset_named(world.alpha, "dataset", "wiki"), tmp_path / "broken", source="prefix")

    html = get(world, f"{PAGES}/datasets/wiki/")
    body = html.split("<tbody>")[1]
    rows = [
        [text_of(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", body, flags=re.S)
    ]
    assert [row[0] for row in rows] == ["wiki@3", "wiki@2", "wiki@1"]
    assert rows[0][1:6] == ["Failed", "—", "—", "—", "Prefix"]
    assert rows[1][1:7] == ["Ready", "2", "11 bytes", "latest", "Run output", run.name]
    assert rows[2][1:7] == ["Ready", "2", "11 bytes", "train", "Upload raw/", "—"]
    assert f'href="/w/alpha/runs/{run.name}/"' in body
    assert f'href="{PAGES}/datasets/wiki/versions/{two.number}/"' in body
    assert 'class="state state-failed"' in body
    assert 'class="state state-ready"' in body


def test_a_version_page_shows_what_it_is_and_where_it_came_from(world: Any, tmp_path: Path) -> None:
    """raw → (run) → tokenized → (another run reads it); the model the second run made."""
    raw = make_version(world, tmp_path, "dataset", "raw", source_detail="corpus/")
    set_alias(raw, "train")
    prep = make_run(world)
    RunInput.objects.create(run=prep, version=raw, asked="latest", path="raw")
    tokenized = make_version(
        world, tmp_path, "dataset", "tokenized", source="run", produced_by=prep, derived_from=[raw]
    )
    train = make_run(world)
    RunInput.objects.create(run=train, version=tokenized, asked="1", path="data/tok")
    model = make_version(
        world, tmp_path, "model", "bert", source="run", produced_by=train, derived_from=[tokenized]
    )
    AssetVersion.objects.for_workspace(world.alpha).filter(pk=model.pk).update(
        metrics={"loss": 0.25, "accuracy": 0.9}
    )

    html = get(world, f"{PAGES}/datasets/raw/versions/1/")
    text = text_of(html)
    assert "raw@1" in text
    assert 'class="state state-ready"' in html
    assert 'class="badge mono">latest</span> <span class="badge mono">train</span>' in html
    assert raw.manifest_digest in html
    facts = text_of(html[html.index('<dl class="facts">') : html.index("</dl>")])
    assert facts == (
        f"Files 2 Size 11 bytes Source Upload corpus/ Manifest digest {raw.manifest_digest}"
    )
    # Where it came from: nothing (an upload).
    came_from = text_of(section(html, "lineage-from-heading"))
    assert "No run: it was uploaded." in came_from
    assert "No other version." in came_from
    # What came of it: read by prep, made into tokenized@1.
    came_of = section(html, "lineage-into-heading")
    assert f'href="/w/alpha/runs/{prep.name}/"' in came_of
    assert "asked for latest , at $TAU_DATA_DIR/raw" in text_of(came_of)
    assert f'href="{PAGES}/datasets/tokenized/versions/1/"' in came_of
    assert "metrics-heading" not in html  # a dataset without metrics
    assert "Not checked again since it was made." in text

    html = get(world, f"{PAGES}/datasets/tokenized/versions/latest/")
    came_from = section(html, "lineage-from-heading")
    assert f'href="/w/alpha/runs/{prep.name}/"' in came_from
    assert f'href="{PAGES}/datasets/raw/versions/1/"' in came_from
    came_of = section(html, "lineage-into-heading")
    assert f'href="/w/alpha/runs/{train.name}/"' in came_of
    assert f'href="{PAGES}/models/bert/versions/1/"' in came_of
    assert "Run output" in text_of(html)
    assert "latest names version 1" in text_of(html)

    html = get(world, f"{PAGES}/models/bert/versions/1/")
    metrics = text_of(section(html, "metrics-heading"))
    assert "Metric Final value accuracy 0.9 loss 0.25" in metrics
    assert f'href="{PAGES}/datasets/tokenized/versions/1/"' in section(html, "lineage-from-heading")
    assert "No run has read it yet" in text_of(section(html, "lineage-into-heading"))
    assert 'href="/api/v1/workspaces/alpha/models/bert/versions/1/download/"' in html


def test_a_version_by_alias_and_one_that_does_not_exist(world: Any, tmp_path: Path) -> None:
    set_alias(make_version(world, tmp_path, "dataset", "wiki"), "train")
    html = get(world, f"{PAGES}/datasets/wiki/versions/train/")
    assert "train names version 1" in text_of(html)
    client = world.client_for("viewer")
    for missing in ("2", "nope", "latest%00", "99999999999"):
        assert client.get(f"{PAGES}/datasets/wiki/versions/{missing}/").status_code == 404
    assert client.get(f"{PAGES}/models/wiki/versions/1/").status_code == 404  # a dataset
    assert client.get(f"{PAGES}/datasets/nope/").status_code == 404
    assert client.get(f"{PAGES}/datasets/wi%00ki/").status_code == 404


def test_a_failed_version_says_why_and_a_verified_one_says_so(world: Any, tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "link").symlink_to(tmp_path / "nowhere")
    failed = ingest_folder(
        asset_named(world.alpha, "dataset", "wiki"), tmp_path / "broken", source="prefix"
    )
    assert failed.state == "failed"
    text = text_of(get(world, f"{PAGES}/datasets/wiki/versions/1/"))
    assert f"Failed. {failed.error}" in text
    assert "None: it failed before its files were kept." in text

    good = make_version(world, tmp_path, "dataset", "wiki")
    AssetVersion.objects.for_workspace(world.alpha).filter(pk=good.pk).update(
        verified_at=good.created_at, verify_problems="a.txt: missing from the store"
    )
    verification = text_of(
        section(get(world, f"{PAGES}/datasets/wiki/versions/2/"), "verified-heading")
    )
    assert "Does not verify" in verification
    assert "found 1 problem:" in verification
    assert "a.txt: missing from the store" in verification


def test_the_files_are_paged_by_path_with_short_digests(world: Any, tmp_path: Path) -> None:
    files = {f"part-{n:04}.txt": f"{n}\n".encode() for n in range(205)}
    make_version(world, tmp_path, "dataset", "wiki", files=files)
    first = get(world, f"{PAGES}/datasets/wiki/versions/1/")
    paths = re.findall(r'<td class="stack-lead mono">([^<]+)</td>', first)
    assert paths == sorted(files)[:200]
    assert "Page 1 of 2: 1 to 200 of 205 files" in text_of(first)
    assert 'href="?page=2"' in first
    sha = hashlib.sha256(b"0\n").hexdigest()
    assert f'<span class="mono" title="{sha}">{sha[:12]}…</span>' in first
    second = get(world, f"{PAGES}/datasets/wiki/versions/1/?page=2")
    assert re.findall(r'<td class="stack-lead mono">([^<]+)</td>', second) == sorted(files)[200:]
    assert 'href="?page=1"' in second
    # A page that does not exist is the nearest one.
    assert "Page 2 of 2" in text_of(get(world, f"{PAGES}/datasets/wiki/versions/1/?page=9"))
    assert "Page 1 of 2" in text_of(get(world, f"{PAGES}/datasets/wiki/versions/1/?page=x"))


def test_a_version_being_made_is_followed_live_until_it_is_done(world: Any) -> None:
    content = b"hello"
    waiting, _ = start_upload(
        asset_named(world.alpha, "dataset", "wiki"),
        [{"path": "a.txt", "size": len(content), "sha256": hashlib.sha256(content).hexdigest()}],
    )
    url = f"{PAGES}/datasets/wiki/versions/1/"
    html = get(world, url)
    assert f'data-poll-url="{url}" data-poll-interval="2000"' in html
    assert 'class="state state-ingesting"' in html
    assert "Receiving its files: 0 bytes of 5 bytes kept (0%)." in text_of(html)
    assert "(0 bytes received)" in text_of(html)  # the declared file, not sent yet
    client = world.client_for("viewer")
    fragment = client.get(url, HTTP_HX_REQUEST="true")
    assert fragment.status_code == 200
    assert fragment.content.decode().lstrip().startswith('<div id="version-live"')
    assert "<html" not in fragment.content.decode()
    assert "HX-Request" in fragment["Vary"]
    etag = fragment["ETag"]
    with CaptureQueriesContext(connection) as queries:
        unchanged = client.get(url, HTTP_HX_REQUEST="true", HTTP_IF_NONE_MATCH=etag)
    assert unchanged.status_code == 304
    assert len(queries) == 5  # session, user, access, asset, version: nothing else
    AssetVersion.objects.for_workspace(world.alpha).filter(pk=waiting.pk).update(bytes_done=3)
    moved = client.get(url, HTTP_HX_REQUEST="true", HTTP_IF_NONE_MATCH=etag)
    assert moved.status_code == 200
    assert "3 bytes of 5 bytes kept (60%)" in text_of(moved.content.decode())
    # Done: the fragment comes back without the poller, which ends the polling.
    AssetVersion.objects.for_workspace(world.alpha).filter(pk=waiting.pk).update(
        state="failed", error="a.txt was not sent."
    )
    done = client.get(url, HTTP_HX_REQUEST="true", HTTP_IF_NONE_MATCH=moved["ETag"])
    assert done.status_code == 200
    assert "data-poll-url" not in done.content.decode()
    assert "a.txt was not sent." in done.content.decode()


def test_a_ready_version_does_not_poll(world: Any, tmp_path: Path) -> None:
    make_version(world, tmp_path, "dataset", "wiki")
    assert "data-poll-url" not in get(world, f"{PAGES}/datasets/wiki/versions/1/")


def test_the_run_page_says_what_the_run_read_and_made(world: Any, tmp_path: Path) -> None:
    raw = make_version(world, tmp_path, "dataset", "raw")
    run = make_run(world)
    RunInput.objects.create(run=run, version=raw, asked="latest", path="wiki")
    made = make_version(world, tmp_path, "model", "bert", source="run", produced_by=run)
    html = get(world, f"/w/alpha/runs/{run.name}/")
    data = section(html, "run-data-heading")
    assert f'href="{PAGES}/datasets/raw/versions/1/">raw@1</a>' in data
    assert "asked for latest , at $TAU_DATA_DIR/wiki" in text_of(data)
    assert f'href="{PAGES}/models/bert/versions/{made.number}/">bert@1</a>' in data
    # The live fragment carries it too (the outputs appear when the run ends).
    fragment = world.client_for("viewer").get(f"/w/alpha/runs/{run.name}/", HTTP_HX_REQUEST="true")
    assert 'id="run-data"' in fragment.content.decode()
    # A run that read and made nothing has no Data section.
    quiet = make_run(world)
    assert 'id="run-data"' not in get(world, f"/w/alpha/runs/{quiet.name}/")


def test_another_workspaces_datasets_and_models_do_not_exist_here(
    world: Any, tmp_path: Path
) -> None:
    secret = folder(tmp_path / "secret", {"s.txt": b"secret\n"})
    ingest_folder(asset_named(world.beta, "dataset", "secret"), secret, source="upload")
    ingest_folder(asset_named(world.beta, "model", "secret"), secret, source="upload")
    make_version(world, tmp_path, "dataset", "wiki")
    researcher = world.client_for("researcher")
    for url in (
        f"{PAGES}/datasets/secret/",
        f"{PAGES}/datasets/secret/versions/1/",
        f"{PAGES}/datasets/secret/versions/latest/",
        f"{PAGES}/models/secret/",
        f"{PAGES}/models/secret/versions/1/",
    ):
        assert researcher.get(url).status_code == 404, url
    assert "secret" not in get(world, f"{PAGES}/datasets/", "researcher")
    # beta's admin reads beta's, and alpha's not at all.
    outsider = world.client_for("outsider")
    assert outsider.get("/w/beta/datasets/secret/versions/1/").status_code == 200
    assert "wiki" not in get(world, "/w/beta/datasets/", "outsider")
    for url in (
        f"{PAGES}/datasets/",
        f"{PAGES}/datasets/wiki/",
        f"{PAGES}/datasets/wiki/versions/1/",
    ):
        assert outsider.get(url).status_code == 404, url


# --- Query counts: part of the contract -----------------------------------------------------

#: Session, user and the caller's access come first on every page; the navigation adds one
#: for its workspaces (not in a fragment).
PINNED = {
    "datasets": 7,  # + count, assets (annotated), their aliases
    "dataset": 8,  # + asset, count, versions (with their runs), their aliases
    "version": 12,  # + asset, version, its aliases, made from, made into, read by, files (2)
    "version-fragment": 11,  # the same, less the navigation
}


def count(client: Any, url: str, **headers: str) -> tuple[int, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, **headers)
    assert response.status_code == 200, response.status_code
    return len(queries), [query["sql"][:160] for query in queries.captured_queries]


def grow(world: Any, tmp_path: Path, times: int) -> None:
    """More of everything: datasets with versions and aliases, versions of wiki made from
    wiki@1 by runs, runs that read wiki@1, files."""
    for _ in range(times):
        name = f"set-{len(list(tmp_path.iterdir()))}"
        version = make_version(world, tmp_path, "dataset", name)
        set_alias(version, "train")
        run = make_run(world)
        first = AssetVersion.objects.for_workspace(world.alpha).get(asset__name="wiki", number=1)
        RunInput.objects.create(run=run, version=first, asked="latest", path="wiki")
        make_version(
            world,
            tmp_path,
            "dataset",
            "wiki",
            source="run",
            produced_by=run,
            derived_from=[first, version],
            files={f"f{n}": b"x" for n in range(times)},
        )


@pytest.mark.parametrize("page", sorted(PINNED))
def test_page_query_counts_are_pinned(world: Any, tmp_path: Path, page: str) -> None:
    url, headers = {
        "datasets": (f"{PAGES}/datasets/", {}),
        "dataset": (f"{PAGES}/datasets/wiki/", {}),
        "version": (f"{PAGES}/datasets/wiki/versions/1/", {}),
        "version-fragment": (f"{PAGES}/datasets/wiki/versions/1/", {"HTTP_HX_REQUEST": "true"}),
    }[page]
    make_version(world, tmp_path, "dataset", "wiki", files={"a": b"a", "b": b"b", "c": b"c"})
    client = world.client_for("researcher")
    grow(world, tmp_path, 1)
    few, _ = count(client, url, **headers)
    grow(world, tmp_path, 6)
    many, sql = count(client, url, **headers)
    assert few == many, sql
    assert many == PINNED[page], sql
