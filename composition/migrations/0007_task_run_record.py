"""The inbox ledger row of a django.tasks run keeps when its successful attempt started and the
worker of every attempt (composition.tasks' get_result). Both nullable without a default: in
PostgreSQL adding them rewrites nothing and locks the ledger only for a moment."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('composition', '0006_ledger_indexes'),
    ]

    operations = [
        migrations.AddField(
            model_name='processedmessage',
            name='started_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='processedmessage',
            name='worker_ids',
            field=models.JSONField(blank=True, null=True),
        ),
    ]
