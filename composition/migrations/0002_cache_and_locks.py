from django.db import migrations, models


class Migration(migrations.Migration):
    """Cache and lock state in PostgreSQL: invalidations deferred during a Redis outage, the newest
    fence per resource, and the sequence that gives Redis lock fences an epoch which survives a
    Redis restart (bigint fences are epoch << 32 | counter, hence the 2^31 - 1 ceiling)."""

    dependencies = [("composition", "0001_initial")]
    operations = [
        migrations.CreateModel(
            name="LockFence",
            fields=[
                ("resource", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("fence", models.BigIntegerField()),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={"db_table": "composition_lock_fence"},
        ),
        migrations.CreateModel(
            name="PendingInvalidation",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("alias", models.CharField(max_length=100)),
                ("kind", models.CharField(choices=[("key", "key"), ("namespace", "namespace")], max_length=16)),
                ("target", models.TextField()),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "db_table": "composition_cache_pending_invalidation",
                "indexes": [models.Index(fields=["alias", "id"], name="composition_pending_inv_idx")],
            },
        ),
        migrations.RunSQL(
            "CREATE SEQUENCE IF NOT EXISTS composition_lock_fence_epoch AS bigint MINVALUE 1 MAXVALUE 2147483647",
            reverse_sql="DROP SEQUENCE composition_lock_fence_epoch",
        ),
    ]
