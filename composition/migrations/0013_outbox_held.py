# Held outbox rows (composition.outbox.held): their due time and their status. Their index is
# 0014, built concurrently.

from django.db import migrations, models


class Migration(migrations.Migration):

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
    ]
