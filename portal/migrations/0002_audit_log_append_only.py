"""Make the audit table append-only in the database itself, not only in the application:
UPDATE and DELETE on it fail, whoever issues them."""

from django.db import migrations

POSTGRESQL_FORWARD = """
CREATE OR REPLACE FUNCTION portal_auditevent_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'portal_auditevent is append-only: % refused', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER portal_auditevent_append_only
    BEFORE UPDATE OR DELETE ON portal_auditevent
    FOR EACH ROW EXECUTE FUNCTION portal_auditevent_append_only();
"""
POSTGRESQL_BACKWARD = """
DROP TRIGGER IF EXISTS portal_auditevent_append_only ON portal_auditevent;
DROP FUNCTION IF EXISTS portal_auditevent_append_only();
"""
SQLITE_FORWARD = [
    """CREATE TRIGGER portal_auditevent_no_update BEFORE UPDATE ON portal_auditevent
       BEGIN SELECT RAISE(ABORT, 'portal_auditevent is append-only: UPDATE refused'); END;""",
    """CREATE TRIGGER portal_auditevent_no_delete BEFORE DELETE ON portal_auditevent
       BEGIN SELECT RAISE(ABORT, 'portal_auditevent is append-only: DELETE refused'); END;""",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS portal_auditevent_no_update;",
    "DROP TRIGGER IF EXISTS portal_auditevent_no_delete;",
]


def forward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_FORWARD, params=None)
    elif vendor == "sqlite":
        for statement in SQLITE_FORWARD:
            schema_editor.execute(statement)


def backward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_BACKWARD, params=None)
    elif vendor == "sqlite":
        for statement in SQLITE_BACKWARD:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("portal", "0001_initial")]

    operations = [migrations.RunPython(forward, backward, elidable=False)]
