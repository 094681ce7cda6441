# The index of the dead letters' task, built concurrently: the table may be large and busy (an
# outage's letters), and a plain CREATE INDEX would block the workers writing them. A migration of
# its own: CREATE INDEX CONCURRENTLY cannot run in a transaction.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('composition', '0019_deadletter_task_path'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='deadletter',
            index=models.Index(fields=['task_path'], name='composition_dl_task_path'),
        ),
    ]
