"""RunAttempt.token points at identity.ApiToken (the model moved apps; its table did not).
Runs before the portal app forgets the model (the kernel's migration need not know runs)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("identity", "0001_initial"),
        ("runs", "0003_delivery_claims_waiting_attempts_run_tokens"),
    ]
    run_before = [("portal", "0006_identity_models_moved")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="runattempt",
                    name="token",
                    field=models.OneToOneField(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="identity.apitoken",
                    ),
                )
            ],
            database_operations=[],
        )
    ]
