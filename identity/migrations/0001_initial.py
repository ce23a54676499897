"""API tokens and OpenID Connect identities move from the portal app (the kernel) to the
identity app. Their tables stay as they are (``portal_apitoken``, ``portal_oidcidentity``):
only Django's idea of which app owns them changes, and the content types (with the
permissions granted on them) are renamed rather than created anew."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

MOVED = ("apitoken", "oidcidentity")


def rename_content_types(apps, schema_editor, old="portal", new="identity"):  # noqa: ANN001, ANN201
    ContentType = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        if ContentType.objects.filter(app_label=new, model=model).exists():
            continue
        ContentType.objects.filter(app_label=old, model=model).update(app_label=new)


def restore_content_types(apps, schema_editor):  # noqa: ANN001, ANN201
    rename_content_types(apps, schema_editor, old="identity", new="portal")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("portal", "0005_remove_apitoken_run"),
        ("workspaces", "0002_membership_source"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ApiToken",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "name",
                            models.CharField(
                                help_text="What it is for, e.g. 'laptop CLI'.", max_length=100
                            ),
                        ),
                        (
                            "kind",
                            models.CharField(
                                choices=[("user", "User token"), ("run", "Run token")],
                                default="user",
                                max_length=10,
                            ),
                        ),
                        ("key", models.CharField(editable=False, max_length=16, unique=True)),
                        ("secret_hash", models.CharField(editable=False, max_length=64)),
                        ("pepper_id", models.PositiveSmallIntegerField(editable=False)),
                        ("read_only", models.BooleanField(default=False)),
                        (
                            "created_at",
                            models.DateTimeField(default=django.utils.timezone.now, editable=False),
                        ),
                        ("expires_at", models.DateTimeField()),
                        (
                            "last_used_at",
                            models.DateTimeField(blank=True, editable=False, null=True),
                        ),
                        ("revoked_at", models.DateTimeField(blank=True, editable=False, null=True)),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="api_tokens",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "workspace",
                            models.ForeignKey(
                                blank=True,
                                help_text="Empty: every workspace the user belongs to.",
                                null=True,
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="workspaces.workspace",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "portal_apitoken",
                        "ordering": ["-created_at"],
                        "indexes": [
                            models.Index(
                                fields=["user", "-created_at"], name="apitoken_user_created"
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="OIDCIdentity",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("issuer", models.CharField(max_length=255)),
                        ("subject", models.CharField(max_length=255)),
                        (
                            "created_at",
                            models.DateTimeField(default=django.utils.timezone.now, editable=False),
                        ),
                        ("last_login_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="oidc_identities",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "portal_oidcidentity",
                        "verbose_name": "OpenID Connect identity",
                        "verbose_name_plural": "OpenID Connect identities",
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("issuer", "subject"), name="oidc_identity_unique"
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(rename_content_types, restore_content_types),
    ]
