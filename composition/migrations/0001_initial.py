from django.db import migrations


class Migration(migrations.Migration):
    """Start of the composition app's history; later migrations add the models."""

    initial = True
    dependencies: list = []
    operations: list = []
