"""Datasets and models of a workspace, their versions, files and aliases (issue 33).

One table for both kinds (:class:`Asset`): a dataset and a model are the same thing to keep —
a name with numbered, immutable versions, each a manifest of files — and differ in where
they come from and what reads them. A version is ``ingesting`` while its files are written,
``verifying`` while they are checked, then ``ready``; or ``failed`` with a reason naming the
file. Nothing half-written is ever ``ready``: its manifest digest, counts and files are
written in the one transaction that makes it so.
"""

from __future__ import annotations

import re
from typing import ClassVar

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from portal.tenancy import TenantModel

#: Names of datasets, models and aliases: lowercase letters, digits, ``.``, ``_`` and ``-``,
#: starting with a letter or digit (they appear in ``name@alias`` and in URLs).
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
#: Aliases the catalog keeps itself.
AUTOMATIC_ALIASES = frozenset({"latest"})


def validate_name(value: str) -> None:
    if not NAME.fullmatch(value or ""):
        raise ValidationError(
            f"{value!r} is not a name here: use 1 to 63 lowercase letters, digits, '.', '_' "
            "and '-', starting with a letter or a digit."
        )


class Asset(TenantModel):
    """A dataset or a model of a workspace: a name with numbered versions."""

    class Kind(models.TextChoices):
        DATASET = "dataset", "dataset"
        MODEL = "model", "model"

    workspace = models.ForeignKey(
        "workspaces.Workspace", on_delete=models.CASCADE, related_name="assets"
    )
    kind = models.CharField(max_length=8, choices=Kind.choices)
    name = models.CharField(max_length=63, validators=[validate_name])
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta(TenantModel.Meta):
        ordering = ["kind", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "kind", "name"], name="catalog_asset_name_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


class AssetVersion(TenantModel):
    """One immutable version: a manifest of files, where they came from, what came of them."""

    tenant_path: ClassVar[str | None] = "asset__workspace"

    class State(models.TextChoices):
        INGESTING = "ingesting", "ingesting"
        VERIFYING = "verifying", "verifying"
        READY = "ready", "ready"
        FAILED = "failed", "failed"
        #: Its files are gone; its manifest stays, because a run's record names it
        #: (``catalog.deletion``).
        DELETED = "deleted", "files deleted"

    class Source(models.TextChoices):
        UPLOAD = "upload", "upload"
        URL = "url", "URL"
        PREFIX = "prefix", "prefix"
        RUN = "run", "run output"

    asset = models.ForeignKey(Asset, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.INGESTING)
    source = models.CharField(max_length=8, choices=Source.choices)
    #: Where the files came from, said for people (a folder, a URL without credentials).
    source_detail = models.CharField(max_length=1024, blank=True)
    #: A version registered in place (``catalog.prefixes``): its files stay in the
    #: workspace's folder of prefixes, at ``prefix`` (relative to that folder; empty: all of
    #: it), and are read there, each checked against its SHA-256, whenever they are read. No
    #: copy of them is in the store, and they do not count against the storage quota.
    in_place = models.BooleanField(default=False)
    prefix = models.CharField(max_length=1024, blank=True)
    #: ``sha256:<hex>`` of the manifest's canonical form (tau.manifest), once ready.
    manifest_digest = models.CharField(max_length=71, blank=True)
    #: An upload's manifest as the uploader declared it before sending a byte: sending the
    #: same files again finds this version and goes on where it stopped (catalog.uploads).
    declared_digest = models.CharField(max_length=71, blank=True)
    files_count = models.PositiveIntegerField(default=0)
    bytes = models.PositiveBigIntegerField(default=0)
    #: Progress while ingesting or verifying.
    bytes_done = models.PositiveBigIntegerField(default=0)
    bytes_total = models.PositiveBigIntegerField(default=0)
    error = models.TextField(blank=True)
    derived_from = models.ManyToManyField(
        "self", symmetrical=False, blank=True, related_name="derivatives"
    )
    produced_by = models.ForeignKey(
        "runs.Run", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    #: The last sign of life of its ingest (bytes written, a piece received, a change of
    #: state): one left ``ingesting`` or ``verifying`` by a process that died is found by it
    #: (``catalog.sweep.sweep_versions``).
    touched_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)
    #: The final value of each metric of the run that made it (``produced_by``), kept when
    #: it was made: what ``best`` compares, still there when the run's metrics are gone.
    metrics = models.JSONField(default=dict, blank=True)
    #: The last time every stored file was read again (``verify``), and what it found wrong
    #: (empty: nothing).
    verified_at = models.DateTimeField(null=True, blank=True)
    verify_problems = models.TextField(blank=True)
    #: When its files were deleted (state ``deleted``), and by whom.
    deleted_at = models.DateTimeField(null=True, blank=True)
    deleted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta(TenantModel.Meta):
        ordering = ["asset", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["asset", "number"], name="catalog_version_once"),
            models.CheckConstraint(
                condition=~models.Q(state="ready") | ~models.Q(manifest_digest=""),
                name="catalog_ready_has_a_manifest",
            ),
            models.CheckConstraint(
                condition=models.Q(in_place=False) | models.Q(source="prefix"),
                name="catalog_in_place_is_a_prefix",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.asset.name}@{self.number}"

    @property
    def ref(self) -> str:
        return f"{self.asset.name}@{self.number}"


class AssetFile(TenantModel):
    """One file of a version, as its manifest lists it; its bytes are the workspace's blob of
    that SHA-256 (catalog.storage), or, for a version registered in place, the file at
    ``path`` under its prefix (catalog.in_place)."""

    tenant_path: ClassVar[str | None] = "version__asset__workspace"

    version = models.ForeignKey(AssetVersion, on_delete=models.CASCADE, related_name="files")
    path = models.CharField(max_length=1024)
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    #: Whether its bytes are whole where the version keeps them (the store; the prefix for a
    #: version registered in place). Only an upload's files start without them: the
    #: uploader declares every file first, then sends them, ``received`` bytes so far.
    stored = models.BooleanField(default=True)
    received = models.PositiveBigIntegerField(default=0)

    class Meta(TenantModel.Meta):
        ordering = ["version", "path"]
        constraints = [
            models.UniqueConstraint(fields=["version", "path"], name="catalog_file_once")
        ]

    def __str__(self) -> str:
        return self.path


class AssetAlias(TenantModel):
    """A name members give a version (``train``, ``production``); ``latest`` is automatic."""

    tenant_path: ClassVar[str | None] = "asset__workspace"

    asset = models.ForeignKey(Asset, on_delete=models.CASCADE, related_name="aliases")
    name = models.CharField(max_length=63, validators=[validate_name])
    version = models.ForeignKey(AssetVersion, on_delete=models.CASCADE, related_name="aliases")
    set_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    set_at = models.DateTimeField(default=timezone.now)

    class Meta(TenantModel.Meta):
        ordering = ["asset", "name"]
        constraints = [models.UniqueConstraint(fields=["asset", "name"], name="catalog_alias_once")]

    def __str__(self) -> str:
        return f"{self.asset.name}@{self.name}"


class RunInput(TenantModel):
    """A dataset version a run reads, pinned when the run was submitted (an alias resolved
    then, never again: a retry or a resume reads the same bytes), and where the run sees it
    under ``TAU_DATA_DIR``."""

    tenant_path: ClassVar[str | None] = "run__workspace"

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    #: PROTECT: a version a run read stays in the record (catalog.ingest.delete_asset).
    version = models.ForeignKey(AssetVersion, on_delete=models.PROTECT, related_name="readers")
    #: What the spec asked for (``train``, ``3``, ``latest``).
    asked = models.CharField(max_length=63)
    path = models.CharField(max_length=1024)

    class Meta(TenantModel.Meta):
        ordering = ["run", "path"]
        constraints = [models.UniqueConstraint(fields=["run", "path"], name="catalog_input_once")]

    def __str__(self) -> str:
        return f"{self.version} at {self.path}"
