"""Invalidations recorded in PostgreSQL until Redis has applied them (see composition.cache.invalidation)."""

from __future__ import annotations

from typing import ClassVar

from django.db import models

__all__ = ["PendingInvalidation"]


class PendingInvalidation(models.Model):
    """One recorded invalidation: delete a key's entry, or bump a namespace's version.

    Written in the writer's own transaction by every ``invalidate()`` inside one (so it commits
    with the data it invalidates), and deleted right after commit once Redis applied it; outside
    a transaction, written only after a failed Redis delete. A row still here (Redis unreachable,
    or the process died after COMMIT) is applied and deleted by the replay.
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
