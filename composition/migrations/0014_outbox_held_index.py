# The index the sweep's release of due held rows reads, built concurrently: the outbox table may
# be large and busy. A migration of its own: CREATE INDEX CONCURRENTLY cannot run in a
# transaction, and 0013's changes must not depend on the build succeeding.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('composition', '0013_outbox_held'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='outboxmessage',
            index=models.Index(condition=models.Q(('status', 'held')), fields=['due_at'], name='outbox_held_due_idx'),
        ),
    ]
