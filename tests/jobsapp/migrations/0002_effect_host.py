from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("jobsapp", "0001_initial")]

    operations = [
        migrations.AddField(model_name="effect", name="host",
                            field=models.CharField(blank=True, default="", max_length=40)),
    ]
