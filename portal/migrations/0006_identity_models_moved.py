"""ApiToken and OIDCIdentity now belong to the identity app (its migration 0001 takes them
over, tables unchanged); the kernel forgets them. Nothing in the database changes."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("portal", "0005_remove_apitoken_run")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="ApiToken"),
                migrations.DeleteModel(name="OIDCIdentity"),
            ],
            database_operations=[],
        )
    ]
