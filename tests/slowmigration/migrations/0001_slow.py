"""A migration that holds one statement for ``SLOW_MIGRATION_S`` seconds, as an index build or
a data migration on a big table would."""

import os

from django.db import migrations


def hold(apps, schema_editor):  # type: ignore[no-untyped-def]
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [float(os.environ.get("SLOW_MIGRATION_S", "0"))])


class Migration(migrations.Migration):
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(hold, migrations.RunPython.noop)]
