"""Held outbox rows (``composition.outbox.held``): their due time and the index the sweep's
release reads. The index is built concurrently: the outbox table may be large and busy."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):

    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ('composition', '0012_task_records'),
    ]

    operations = [
        migrations.AddField(
            model_name='outboxmessage',
            name='due_at',
            field=models.DateTimeField(blank=True, help_text="A held row's time to run (publish time plus its delay); it is relayed then.", null=True),
        ),
        migrations.AlterField(
            model_name='outboxmessage',
            name='status',
            field=models.CharField(choices=[('pending', 'pending'), ('sent', 'sent'), ('held', 'held until due')], default='pending', max_length=16),
        ),
        AddIndexConcurrently(
            model_name='outboxmessage',
            index=models.Index(condition=models.Q(('status', 'held')), fields=['due_at'], name='outbox_held_due_idx'),
        ),
    ]
