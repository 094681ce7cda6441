"""Dead letters and the inbox ledger, in PostgreSQL.

``DeadLetter`` is the operator's copy of a message that will not run again by itself (Dramatiq's
broker-side dead-letter queue expires and is not searchable). ``ProcessedMessage`` records the
message ids whose database effects have committed, so a redelivered message has no second effect.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

__all__ = ["DeadLetter", "ProcessedMessage"]


class DeadLetter(models.Model):
    """One message that failed for good: a permanent error or its last allowed attempt.

    ``fingerprint`` groups failures with the same cause (actor + error class + normalised
    message), so one bad deploy is one group, not thousands of rows to read one by one.
    """

    class Status(models.TextChoices):
        DEAD = "dead", "dead"
        REPLAYED = "replayed", "replayed"
        DISCARDED = "discarded", "discarded"

    actor = models.CharField(max_length=255, db_index=True)
    queue = models.CharField(max_length=255)
    message_id = models.CharField(max_length=255, unique=True)
    # The job's keyword arguments (what the outbox publishes) and any positional ones (only a
    # plain ``actor.send(...)`` sends those).
    payload = models.JSONField(default=dict, blank=True)
    args = models.JSONField(default=list, blank=True)
    # message.options["composition"] as the relay wrote it: request id, publish time, outbox id.
    headers = models.JSONField(default=dict, blank=True)
    attempts = models.PositiveIntegerField()
    error_class = models.CharField(max_length=255, db_index=True)
    error_message = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    fingerprint = models.CharField(max_length=64, db_index=True)
    first_failed_at = models.DateTimeField()
    last_failed_at = models.DateTimeField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DEAD, db_index=True)
    replayed_at = models.DateTimeField(null=True, blank=True)
    replayed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                    on_delete=models.SET_NULL, related_name="+")
    # The OutboxMessage the replay wrote (a plain id: the outbox is its own subsystem and its
    # rows are pruned independently of dead letters).
    replay_outbox_id = models.BigIntegerField(null=True, blank=True)
    discarded_at = models.DateTimeField(null=True, blank=True)
    discarded_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        app_label = "composition"
        ordering = ("-last_failed_at", "-id")
        indexes = [models.Index(fields=["status", "actor"], name="composition_dl_status_actor")]
        permissions = [
            ("replay_deadletter", "Can replay dead letters"),
            ("discard_deadletter", "Can discard dead letters"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.message_id} ({self.status}: {self.error_class})"


class ProcessedMessage(models.Model):
    """Inbox ledger: this message id's effects have committed; redeliveries are skipped.

    Every idempotent job writes one row, so every index is a write per job. ``message_id`` is
    unique by a constraint, not ``unique=True``: on PostgreSQL that would add a second index on
    the column (``varchar_pattern_ops``, for LIKE queries nobody runs on random ids), one more
    random-key write per job. ``processed_at`` keeps its b-tree, an append at the index's right
    edge (the cheap kind of index write): retention looks the expired rows up by it.
    """

    message_id = models.CharField(max_length=255)
    actor = models.CharField(max_length=255)
    processed_at = models.DateTimeField(default=timezone.now, db_index=True)
    # A django.tasks run's (composition.tasks): when its successful attempt started and the
    # worker of every attempt, replays included, for get_result. NULL for other jobs.
    started_at = models.DateTimeField(null=True, blank=True)
    worker_ids = models.JSONField(null=True, blank=True)
    # A django.tasks run's JSON return value (TASK_RETURN_VALUE_MAX_BYTES at most); NULL otherwise.
    return_value = models.JSONField(null=True, blank=True)

    class Meta:
        app_label = "composition"
        constraints = [
            # The name PostgreSQL gave the unique=True constraint it replaces (migration 0006).
            models.UniqueConstraint(fields=["message_id"], name="composition_processedmessage_message_id_key"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.message_id}"
