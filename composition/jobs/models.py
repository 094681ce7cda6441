"""Dead letters, the inbox ledger and the results of ``django.tasks`` runs, in PostgreSQL.

``DeadLetter`` is the operator's copy of a message that will not run again by itself (Dramatiq's
broker-side dead-letter queue expires and is not searchable). ``ProcessedMessage`` records the
message ids whose database effects have committed, so a redelivered message has no second effect.
``TaskRecord`` is a ``django.tasks`` result (``composition.tasks``): here, not in that package,
because the table exists whether or not ``django.tasks`` is installed.
"""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

__all__ = ["DeadLetter", "ProcessedMessage", "TaskRecord"]


class DeadLetter(models.Model):
    """One message that failed for good: a permanent error or its last allowed attempt.

    ``fingerprint`` groups failures with the same cause (actor, and task for a task's letter, +
    error class + normalised message), so one bad deploy is one group, not thousands of rows to read one by one.
    """

    class Status(models.TextChoices):
        DEAD = "dead", "dead"
        REPLAYED = "replayed", "replayed"
        DISCARDED = "discarded", "discarded"

    actor = models.CharField(max_length=255, db_index=True)
    # The task, for a django.tasks task's letter: its actor runs every task of its queue.
    # db_default: a rolling deploy's older workers write letters without the column. Its index
    # is built concurrently by a migration of its own (0020): the table may be large and busy.
    task_path = models.CharField(max_length=1024, blank=True, default="", db_default="",
                                 help_text="The task's module path, for a django.tasks task.")
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
        indexes = [models.Index(fields=["status", "actor"], name="composition_dl_status_actor"),
                   models.Index(fields=["task_path"], name="composition_dl_task_path")]
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

    class Meta:
        app_label = "composition"
        constraints = [
            # The name PostgreSQL gave the unique=True constraint it replaces (migration 0006).
            models.UniqueConstraint(fields=["message_id"], name="composition_processedmessage_message_id_key"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.message_id}"


class TaskRecord(models.Model):
    """A task's result: its id (a random UUID, what ``enqueue`` returns and ``get_result`` takes),
    what was enqueued, and what its runs have done so far.

    ``enqueue`` inserts it READY in the caller's transaction, beside the outbox row whose payload
    names it, so a replayed dead letter (same payload) updates the same record. A run marks it
    RUNNING in its own short transaction before it starts, with a lease (``running_until``) that
    the worker process renews while the run lasts; the run's end sets SUCCESSFUL in the run's
    transaction (with the effects, for an ``ATOMIC`` queue), READY again before a retry, or FAILED.
    A RUNNING record whose lease ran out belongs to a process that died: it reads READY, as its
    message is redelivered.
    """

    class Status(models.TextChoices):
        READY = "READY"
        RUNNING = "RUNNING"
        SUCCESSFUL = "SUCCESSFUL"
        FAILED = "FAILED"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    backend = models.CharField(max_length=255, help_text="The TASKS alias.")
    queue_name = models.CharField(max_length=255)
    task_path = models.CharField(max_length=1024, help_text="The task's module path.")
    priority = models.SmallIntegerField(default=0)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.READY)
    enqueued_at = models.DateTimeField(default=timezone.now)
    run_after = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True, help_text="When its first run began.")
    last_attempted_at = models.DateTimeField(null=True, blank=True, help_text="When its latest run began.")
    finished_at = models.DateTimeField(null=True, blank=True)
    running_until = models.DateTimeField(null=True, blank=True,
                                         help_text="A RUNNING record's lease, renewed while its run lasts.")
    worker_ids = models.JSONField(default=list, blank=True, help_text="The worker of every run, oldest first.")
    errors = models.JSONField(default=list, blank=True,
                              help_text="One {exception_class_path, traceback} per failure that ended a run for good.")
    return_value = models.JSONField(null=True, blank=True)
    message_id = models.CharField(max_length=255, blank=True, default="",
                                  help_text="The message of its latest run (its dead letter's, if it failed).")

    objects: ClassVar[models.Manager[TaskRecord]] = models.Manager()

    class Meta:
        app_label = "composition"
        verbose_name = "task result"
        indexes = [
            # Retention finds finished records by age.
            models.Index(fields=["finished_at"], condition=Q(finished_at__isnull=False),
                         name="taskrecord_finished_idx"),
            # The admin lists the newest first, a page at a time.
            models.Index(fields=["enqueued_at"], name="taskrecord_enqueued_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} {self.id} ({self.status})"


class BrokerEpoch(models.Model):
    """One life of the broker's data, as ``composition.jobs.broker_losses`` sees it: the token it
    wrote into the broker when the epoch began. An epoch that began because the token was gone
    (``lost``), or because a queue held fewer messages than it must (``queue``), is a detected
    loss: idempotent jobs sent before it (to that queue) are reconciled from the ledger until
    ``closed_at``; ``resent`` counts the outbox rows it sent again."""

    token = models.CharField(max_length=64, unique=True)
    began_at = models.DateTimeField(default=timezone.now)
    lost = models.BooleanField(default=False, help_text="Began because the broker's data was gone.")
    resent = models.PositiveIntegerField(default=0)
    closed_at = models.DateTimeField(null=True, blank=True)
    cause = models.CharField(max_length=300, blank=True, default="",
                             help_text="What showed the loss: the token gone, or a queue short of messages.")
    queue = models.CharField(max_length=200, blank=True, default="",
                             help_text="The one queue that lost messages; blank: all of them (the token gone).")

    class Meta:
        app_label = "composition"
        verbose_name = "broker epoch"

    def __str__(self) -> str:
        return f"broker epoch {self.pk} ({'lost' if self.lost else 'first'}, {self.began_at:%Y-%m-%d %H:%M:%S})"
