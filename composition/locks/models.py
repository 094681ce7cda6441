"""The newest fencing token seen per resource, for ``composition.locks.fenced_write``."""

from __future__ import annotations

from django.db import models

__all__ = ["LockFence"]


class LockFence(models.Model):
    resource = models.CharField(max_length=255, primary_key=True)
    fence = models.BigIntegerField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "composition_lock_fence"

    def __str__(self) -> str:
        return f"{self.resource} @ {self.fence}"
