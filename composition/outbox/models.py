"""The outbox table: one row per message a committed transaction asked to send."""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.db import models
from django.db.models import Q
from django.utils import timezone

__all__ = ["MESSAGE_ID_NAMESPACE", "OutboxMessage", "message_id_for"]

# Fixed forever: the Dramatiq message id of outbox row N is uuid5(MESSAGE_ID_NAMESPACE, "N"), so
# a row relayed twice (after a relay crash) carries the same id and the inbox ledger sees the
# redelivery.
MESSAGE_ID_NAMESPACE = uuid.UUID("6f1d2c1e-3b7a-5d0e-9a41-0c8f3e2b7d15")

KEY_MAX_LENGTH = 255


def message_id_for(outbox_id: int) -> str:
    """The Dramatiq message id of the outbox row ``outbox_id``."""
    return str(uuid.uuid5(MESSAGE_ID_NAMESPACE, str(outbox_id)))


class OutboxMessage(models.Model):
    """A message written in the caller's transaction and relayed to the broker after commit.

    A row is ``pending`` until a relay has enqueued it, then ``sent``; one published with a delay
    over ``OUTBOX_HELD_DELAY_S`` is ``held`` until ``due_at`` (``composition.outbox.held``). A
    relay claims a row by
    setting a lease (``claimed_until``) in a short transaction; a row whose lease has expired is
    claimable again, which is what turns a crashed relay into a redelivery instead of a loss.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        SENT = "sent", "sent"
        HELD = "held", "held until due"

    actor_name = models.CharField(max_length=255)
    # Resolved from the actor at publish, so a relay can enqueue without knowing the actor.
    queue_name = models.CharField(max_length=255)
    payload = models.JSONField(help_text="The job's keyword arguments.")
    key = models.CharField(max_length=KEY_MAX_LENGTH, null=True, blank=True,
                           help_text="Messages sharing a key are relayed in publish order.")
    headers = models.JSONField(default=dict, blank=True,
                               help_text="request_id and published_at (Unix seconds) of the publish.")
    delay_s = models.FloatField(null=True, blank=True,
                                help_text="Run no earlier than this many seconds after publish.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(default=timezone.now, help_text="Publish time.")
    claimed_until = models.DateTimeField(null=True, blank=True,
                                         help_text="Lease of the relay that claimed the row.")
    claimed_by = models.CharField(max_length=255, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0, help_text="How many times a relay claimed the row.")
    sent_at = models.DateTimeField(null=True, blank=True, help_text="When the broker accepted it.")
    last_error = models.TextField(blank=True, default="")
    due_at = models.DateTimeField(
        null=True, blank=True, help_text="A held row's time to run (publish time plus its delay); it is relayed then.")
    reconciled_after_loss = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="The broker epoch (a detected loss of its data) whose reconciliation looked at it: sent again "
                  "unless it had run.")

    objects: ClassVar[models.Manager[OutboxMessage]] = models.Manager()

    class Meta:
        app_label = "composition"
        verbose_name = "outbox message"
        ordering = ("-id",)
        indexes = [
            # The claim scans pending rows in id order and checks each key's oldest pending row;
            # partial indexes stay as small as the backlog, however many sent rows are kept.
            models.Index(fields=["id"], condition=Q(status="pending"), name="outbox_pending_idx"),
            models.Index(fields=["key", "id"], condition=Q(status="pending"), name="outbox_pending_key_idx"),
            models.Index(fields=["sent_at"], condition=Q(status="sent"), name="outbox_sent_at_idx"),
            models.Index(fields=["due_at"], condition=Q(status="held"), name="outbox_held_due_idx"),
        ]

    def __str__(self) -> str:
        return f"outbox #{self.pk} {self.actor_name} ({self.status})"

    @property
    def message_id(self) -> str:
        """The Dramatiq message id this row is (or will be) relayed under."""
        return message_id_for(self.pk)
