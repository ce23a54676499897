"""A priority class for every priority name a workspace already allows.

Before priority classes existed, a workspace's ``allowed_priorities`` was a list of names and
a run's priority was the name's place in that list. Kueue needs one value per name across the
cluster: each name gets 100 times the highest place it has in any workspace's list, so that
within each workspace the order people set up is kept wherever the lists agree. Platform staff
should look the values over (admin, Priority classes).
"""

from django.db import migrations

STEP = 100


def create_priority_classes(apps, schema_editor):  # type: ignore[no-untyped-def]
    workspace_model = apps.get_model("workspaces", "Workspace")
    priority_class_model = apps.get_model("workspaces", "PriorityClass")
    places: dict[str, int] = {}
    for allowed in workspace_model._default_manager.values_list("allowed_priorities", flat=True):
        if not isinstance(allowed, list):
            continue
        for place, name in enumerate(allowed):
            if isinstance(name, str) and name:
                places[name] = max(places.get(name, 0), place)
    for name, place in sorted(places.items()):
        priority_class_model._default_manager.get_or_create(
            name=name,
            defaults={
                "value": place * STEP,
                "description": "Created from the workspaces' priority lists; check the value.",
            },
        )


class Migration(migrations.Migration):
    dependencies = [
        ("workspaces", "0004_kueue_sync_priority_classes_preemption"),
    ]

    operations = [
        migrations.RunPython(create_priority_classes, migrations.RunPython.noop),
    ]
