from django.db import migrations


class Migration(migrations.Migration):
    """Cache and lock state in PostgreSQL (filled in by the cache/locks work)."""

    dependencies = [("composition", "0001_initial")]
    operations: list = []
