"""Models used only by the tests."""

from django.db import models


class Order(models.Model):
    """Business data written in the same transaction as an outbox message."""

    reference = models.CharField(max_length=64)

    class Meta:
        app_label = "outboxapp"


class Effect(models.Model):
    """One row per run of ``record_effect``: no unique constraint, so a double run shows."""

    seq = models.IntegerField()
    order_id = models.BigIntegerField(null=True)

    class Meta:
        app_label = "outboxapp"
