"""What the catalog's API answers: datasets and models, their versions and files."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from catalog.models import NAME, AssetVersion


class AssetSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    kind = serializers.CharField()
    description = serializers.CharField()
    created_at = serializers.DateTimeField()
    versions_count = serializers.IntegerField(help_text="Versions of every state.")
    latest = serializers.IntegerField(
        allow_null=True, help_text="The newest ready version's number (the `latest` alias)."
    )
    aliases = serializers.DictField(
        child=serializers.IntegerField(), help_text="Each alias members set, and its version."
    )


class ProgressSerializer(serializers.Serializer[Any]):
    bytes_done = serializers.IntegerField()
    bytes_total = serializers.IntegerField()


class VersionSerializer(serializers.Serializer[Any]):
    number = serializers.IntegerField()
    ref = serializers.CharField(help_text="`name@number`.")
    state = serializers.ChoiceField(choices=AssetVersion.State.choices)
    # A field named like Field.source, which DRF's metaclass takes off the class.
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=AssetVersion.Source.choices
    )
    source_detail = serializers.CharField(help_text="Where the files came from, for people.")
    in_place = serializers.BooleanField(
        help_text="Registered in place (source `prefix`): its files stay at `prefix` in the "
        "workspace's folder, are not copied into the store nor counted against its storage "
        "quota, and are checked against the manifest whenever they are read."
    )
    prefix = serializers.CharField(
        allow_null=True,
        help_text="Where the files of a version registered in place live, relative to the "
        "workspace's folder of prefixes ('' for all of it); null for any other version.",
    )
    manifest_digest = serializers.CharField(
        help_text="`sha256:` and the digest of the manifest's canonical form (docs); empty "
        "until ready."
    )
    files_count = serializers.IntegerField()
    bytes = serializers.IntegerField()
    progress = ProgressSerializer()
    error = serializers.CharField(help_text="Why it failed, naming the file; empty otherwise.")
    derived_from = serializers.ListField(
        child=serializers.CharField(), help_text="The dataset versions it was made from."
    )
    produced_by = serializers.CharField(
        allow_null=True, help_text="The run whose output it is, if a run made it."
    )
    aliases = serializers.ListField(child=serializers.CharField())
    metrics = serializers.DictField(
        child=serializers.FloatField(),
        help_text="The final value of each metric of the run that made it (empty otherwise).",
    )
    created_at = serializers.DateTimeField()
    ready_at = serializers.DateTimeField(allow_null=True)
    deleted_at = serializers.DateTimeField(
        allow_null=True,
        help_text="When its files were deleted (state `deleted`: the manifest stays, because a "
        "run's record names it).",
    )


class FileSerializer(serializers.Serializer[Any]):
    path = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()
    stored = serializers.BooleanField(
        help_text="Whether the store holds its bytes (an upload's files, until sent: false)."
    )
    received = serializers.IntegerField(help_text="Bytes of it the portal holds.")


class FilesPageSerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField(help_text="Files of the version in all.")
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = FileSerializer(many=True)


class AssetCreateSerializer(serializers.Serializer[Any]):
    name = serializers.RegexField(
        NAME.pattern.join("^$"),
        max_length=63,
        help_text="1 to 63 lowercase letters, digits, '.', '_' and '-', starting with a "
        "letter or a digit.",
        error_messages={
            "invalid": "Not a name here: use 1 to 63 lowercase letters, digits, '.', '_' and "
            "'-', starting with a letter or a digit."
        },
    )
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)


class DeclaredFileSerializer(serializers.Serializer[Any]):
    path = serializers.CharField(
        max_length=1024, help_text="Relative, '/'-separated, no '.' or '..' parts."
    )
    size = serializers.IntegerField(min_value=0)
    sha256 = serializers.RegexField(r"^[0-9a-f]{64}$", help_text="64 lowercase hex digits.")


class VersionStartSerializer(serializers.Serializer[Any]):
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=[
            ("upload", "upload"),
            ("url", "url"),
            ("prefix", "prefix"),
            ("run", "run"),
            ("checkpoint", "checkpoint"),
        ],
        help_text="`upload`: the files are declared here, then sent with PUT "
        "…/versions/{version}/files/{path}. `url`: the portal downloads the one file at "
        "`url` (http or https; the webhook rules for where it may connect) into the version "
        "at `path`, or the objects `s3://bucket/key` or `s3://bucket/prefix/` names from the "
        "S3 service it is set up for (buckets in TAU_DATA_SOURCE_BUCKETS only; under `path`); "
        "the version is `ingesting` until it is kept (`progress`). `prefix`: the files "
        "under `prefix` of the workspace's folder on the portal (TAU_DATA_PREFIX_DIR), read, "
        "hashed and registered in place by a worker, with progress as for a URL: nothing is "
        "copied, and every read checks the files against the manifest. `run`: the "
        "artifacts a succeeded run kept under `path` become the version. `checkpoint`: the "
        "run's complete checkpoint at `step` (default: its newest complete one; the run need "
        "not have succeeded) becomes the version, a folder's files by their paths in it or a "
        "file by its name, read where the run's backend keeps it (on this machine only: a "
        "cluster run's checkpoints are refused, saying what to do instead); the model is "
        "made if it is new, once the checkpoint is found. Both make a version produced by "
        "the run and derived from the versions it read.",
    )
    files = DeclaredFileSerializer(
        many=True,
        required=False,
        help_text="An upload: every file of the version. Declaring the same files again while "
        "an upload of them is unfinished answers that version (200), to go on with.",
    )
    run = serializers.CharField(
        required=False, help_text="A run's full name (sources `run` and `checkpoint`)."
    )
    step = serializers.IntegerField(
        required=False,
        help_text="The step of the run's checkpoint that becomes the version (source "
        "`checkpoint`; default: its newest complete checkpoint).",
    )
    prefix = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="A folder under the workspace's own on the portal (source `prefix`): "
        "`raw/2026-11`; empty: all of it.",
    )
    url = serializers.URLField(
        required=False,
        help_text="The file to download (source `url`): https://…, or s3://bucket/key (one "
        "object), s3://bucket/prefix/ (every object under it).",
    )
    path = serializers.CharField(
        required=False,
        help_text="The path of the run's artifacts (`model/`; source `run`), or where the "
        "downloaded file goes in the version (source `url`; default: the URL's last segment; "
        "for an s3:// prefix, the folder its objects go under).",
    )


class StartedSerializer(VersionSerializer):
    files_missing = serializers.IntegerField(
        help_text="Declared files the portal does not hold whole yet: send them."
    )


class PieceSerializer(serializers.Serializer[Any]):
    path = serializers.CharField()
    size = serializers.IntegerField()
    received = serializers.IntegerField(help_text="Bytes of the file the portal holds now.")
    stored = serializers.BooleanField(help_text="Whole, checked and kept.")
    version_state = serializers.CharField(help_text="The version's state after this piece.")


class VerifiedSerializer(serializers.Serializer[Any]):
    ok = serializers.BooleanField()
    problems = serializers.ListField(
        child=serializers.CharField(),
        help_text="Each file missing or changed in the store (or, for a version registered in "
        "place, at its prefix), by path.",
    )
    verified_at = serializers.DateTimeField()


class AliasSetSerializer(serializers.Serializer[Any]):
    version = serializers.CharField(
        max_length=63, help_text="The version it names: a number, or another alias."
    )


class AliasSerializer(serializers.Serializer[Any]):
    alias = serializers.CharField()
    version = serializers.IntegerField()
