from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0004_apitoken_run"),
    ]

    operations = [
        migrations.RemoveField(
            model_name="apitoken",
            name="run",
        ),
    ]
