"""What the catalog's API answers: datasets and models, their versions and files."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


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
    state = serializers.ChoiceField(choices=["ingesting", "verifying", "ready", "failed"])
    # A field named like Field.source, which DRF's metaclass takes off the class.
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=["upload", "url", "prefix", "run"]
    )
    source_detail = serializers.CharField(help_text="Where the files came from, for people.")
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
    created_at = serializers.DateTimeField()
    ready_at = serializers.DateTimeField(allow_null=True)


class FileSerializer(serializers.Serializer[Any]):
    path = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()


class FilesPageSerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField(help_text="Files of the version in all.")
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = FileSerializer(many=True)
