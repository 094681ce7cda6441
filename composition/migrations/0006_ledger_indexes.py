"""The inbox ledger loses its LIKE index: one index write less for every idempotent job.

``unique=True`` on a CharField gives PostgreSQL two indexes on the column, the unique one and a
``varchar_pattern_ops`` one for LIKE queries (which nobody runs on message ids). The model now
says ``UniqueConstraint`` instead, which Django backs with the unique index alone. In the
database that is only a DROP INDEX: the unique constraint that PostgreSQL named for the old
field is the constraint the new state names, so it stays as it is (rebuilding it would lock the
ledger, hence every idempotent job, for as long as the build takes).
"""

from django.db import migrations, models

# Django's name for the LIKE index of composition_processedmessage.message_id (a hash of the table
# and column names, the same in every database that ran 0004).
LIKE_INDEX = "composition_processedmessage_message_id_4b30ff1a_like"


class Migration(migrations.Migration):

    dependencies = [
        ('composition', '0005_operations'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='processedmessage',
                    name='message_id',
                    field=models.CharField(max_length=255),
                ),
                migrations.AddConstraint(
                    model_name='processedmessage',
                    constraint=models.UniqueConstraint(fields=('message_id',),
                                                       name='composition_processedmessage_message_id_key'),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{LIKE_INDEX}"',
                    reverse_sql=f'CREATE INDEX IF NOT EXISTS "{LIKE_INDEX}" ON "composition_processedmessage"'
                                ' ("message_id" varchar_pattern_ops)',
                ),
            ],
        ),
    ]
