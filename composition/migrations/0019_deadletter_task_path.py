# The task of a django.tasks task's dead letter. A column with a constant default: no table
# rewrite, and a rolling deploy's older workers write letters without it. Letters written before
# it name no task (their task is in their payload); the index comes in 0020.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('composition', '0018_schedule_previous_timing'),
    ]

    operations = [
        migrations.AddField(
            model_name='deadletter',
            name='task_path',
            field=models.CharField(blank=True, db_default='', default='', help_text="The task's module path, for a django.tasks task.", max_length=1024),
        ),
    ]
