from django.db import migrations


class Migration(migrations.Migration):
    """The outbox table (filled in by the outbox work)."""

    dependencies = [("composition", "0002_cache_and_locks")]
    operations: list = []
