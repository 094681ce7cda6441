import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    """The outbox table, with partial indexes sized by the backlog rather than the history."""

    dependencies = [("composition", "0002_cache_and_locks")]
    operations = [
        migrations.CreateModel(
            name="OutboxMessage",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("actor_name", models.CharField(max_length=255)),
                ("queue_name", models.CharField(max_length=255)),
                ("payload", models.JSONField(help_text="The job's keyword arguments.")),
                ("key", models.CharField(blank=True, help_text="Messages sharing a key are relayed in publish order.",
                                         max_length=255, null=True)),
                ("headers", models.JSONField(blank=True, default=dict,
                                             help_text="request_id and published_at (Unix seconds) of the publish.")),
                ("delay_s", models.FloatField(blank=True, help_text="Run no earlier than this many seconds after publish.",
                                              null=True)),
                ("status", models.CharField(choices=[("pending", "pending"), ("sent", "sent")], default="pending",
                                            max_length=16)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now, help_text="Publish time.")),
                ("claimed_until", models.DateTimeField(blank=True, help_text="Lease of the relay that claimed the row.",
                                                       null=True)),
                ("claimed_by", models.CharField(blank=True, default="", max_length=255)),
                ("attempts", models.PositiveIntegerField(default=0, help_text="How many times a relay claimed the row.")),
                ("sent_at", models.DateTimeField(blank=True, help_text="When the broker accepted it.", null=True)),
                ("last_error", models.TextField(blank=True, default="")),
            ],
            options={
                "verbose_name": "outbox message",
                "ordering": ("-id",),
                "indexes": [
                    models.Index(condition=models.Q(("status", "pending")), fields=["id"], name="outbox_pending_idx"),
                    models.Index(condition=models.Q(("status", "pending")), fields=["key", "id"],
                                 name="outbox_pending_key_idx"),
                    models.Index(condition=models.Q(("status", "sent")), fields=["sent_at"], name="outbox_sent_at_idx"),
                ],
            },
        ),
    ]
