"""Invalidations that could not reach Redis, kept in PostgreSQL until some process replays them."""

from __future__ import annotations

from typing import ClassVar

from django.db import models

__all__ = ["PendingInvalidation"]


class PendingInvalidation(models.Model):
    """One deferred invalidation: delete a key's entry, or bump a namespace's version.

    Written in the writer's own transaction when the breaker is already open (so it commits with
    the data it invalidates), else right after a failed Redis delete; deleted once replayed.
    """

    KIND_KEY = "key"  # the values of composition.cache.invalidation.KIND_*
    KIND_NAMESPACE = "namespace"
    KIND_CHOICES = [(KIND_KEY, "key"), (KIND_NAMESPACE, "namespace")]

    alias = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=KIND_CHOICES)
    target = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    objects: ClassVar[models.Manager[PendingInvalidation]] = models.Manager()

    class Meta:
        db_table = "composition_cache_pending_invalidation"
        indexes = [models.Index(fields=["alias", "id"], name="composition_pending_inv_idx")]

    def __str__(self) -> str:
        return f"{self.kind} {self.target} ({self.alias})"
