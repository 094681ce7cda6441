"""``QueueBucket``: one queue's history over one bucket of ``QUEUE_HISTORY_BUCKET_S`` seconds."""

from __future__ import annotations

from django.db import models


class QueueBucket(models.Model):
    """What a queue held and ran during one bucket: its largest depth seen, the runs that ended
    (``processed``, of which ``failed``: a retry or a dead letter), and whether it was paused or
    shed at some point. Every worker process adds to the same row (``composition.queues.history``)."""

    queue = models.CharField(max_length=255)
    started_at = models.DateTimeField(help_text="the bucket's start")
    depth = models.BigIntegerField(null=True, help_text="the largest depth sampled (None: the broker did not answer)")
    processed = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    paused = models.BooleanField(default=False)
    shed = models.BooleanField(default=False)

    class Meta:
        app_label = "composition"
        constraints = [models.UniqueConstraint(fields=["queue", "started_at"], name="composition_queuebucket_once")]
        indexes = [models.Index(fields=["started_at"], name="composition_queuebucket_age")]

    def __str__(self) -> str:
        return f"{self.queue} at {self.started_at:%H:%M:%S}"
