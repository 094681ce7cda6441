"""Purging a paused queue into the dead-letter store: ``purge_queue``.

Its unsent outbox rows, ready messages and delayed messages no worker holds become open dead
letters of error class ``composition.jobs.deadletters.Purged``, replayable, so a mistaken purge
is undone by replaying its group. Only a paused queue is purged, once every worker has read the
pause: nothing taken is also started. Each message is recorded before it leaves the outbox (one
transaction) or the broker (``composition.broker.purging``), and a dead letter's message id is
unique: a purge cut short loses nothing, and purging again records nothing twice.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import structlog
from django.apps import apps
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Now
from django.utils import timezone
from dramatiq.common import dq_name
from dramatiq.message import Message

from composition.backpressure.depth import broker_counts
from composition.broker.configured import configured_broker
from composition.broker.purging import take_waiting
from composition.conf import conf
from composition.errors import CompositionError
from composition.jobs.deadletters import PURGED_ERROR_CLASS, Failure, dead_letter_fields
from composition.jobs.models import DeadLetter
from composition.outbox.claims import ClaimedMessage
from composition.outbox.models import OutboxMessage
from composition.pauses import Pause
from composition.queues.control import checked_queue

__all__ = [
    "OUTBOX_BATCH",
    "PAUSE_READ_MARGIN_S",
    "PurgeResult",
    "QueueNotPaused",
    "Waiting",
    "purge_queue",
    "waiting_to_purge",
]

log = structlog.get_logger("composition.queues")

# Outbox rows per transaction: a purge of a million rows holds no lock for long.
OUTBOX_BATCH = 500
# Waited beyond QUEUE_PAUSE_REFRESH_S after a pause before purging: a worker's read of the pauses
# takes a query, and its consumer a fetch to notice.
PAUSE_READ_MARGIN_S = 1.0


class QueueNotPaused(CompositionError):
    """A queue is purged only while paused: workers would otherwise start what the purge takes."""


@dataclass(frozen=True)
class PurgeResult:
    """What a purge took: outbox rows and broker messages, now dead letters; and how many a
    worker still held (running, prefetched before the pause, or delayed, held until due; None
    where the broker does not count them, RabbitMQ), which the purge left."""

    queue: str
    from_outbox: int
    from_broker: int
    held_by_workers: int | None

    @property
    def purged(self) -> int:
        return self.from_outbox + self.from_broker


@dataclass(frozen=True)
class Waiting:
    """What a purge of the queue would take now (``waiting_to_purge``)."""

    queue: str
    outbox: int
    broker: int


def _ready_count(broker: Any, queue: str) -> int:
    """How many messages wait, ready, on ``queue`` (a work queue or a delay queue)."""
    return broker_counts(queue, broker).ready


def _paused(name: str) -> Pause:
    row = Pause.objects.filter(kind=Pause.QUEUE, name=checked_queue(name), paused=True).first()
    if row is None:
        raise QueueNotPaused(f"queue {name!r} is not paused: pause it first (manage.py queues pause {name}), "
                             "so that no worker starts what the purge takes")
    return row


def waiting_to_purge(name: str) -> Waiting:
    """How many outbox rows and broker messages a purge of ``name`` would take now. Raises
    ``QueueNotPausable`` for a name that is not a queue of this project, and the broker's errors."""
    broker = configured_broker()
    outbox = OutboxMessage.objects.filter(queue_name=checked_queue(name), status__in=_UNSENT).count()
    return Waiting(name, outbox, sum(_ready_count(broker, queue) for queue in (name, dq_name(name))))


def purge_queue(name: str, *, by: str, reason: str = "", user: Any = None) -> PurgeResult:
    """Make every message waiting in the paused queue ``name`` an open dead letter (module doc).

    ``by`` and ``reason`` go into each dead letter's error message (``purged from queue NAME by
    BY: REASON``), so one purge is one group per job; with a ``user`` (a Django user) the purge is
    in the admin's history of the queue's pause too. Waits, when the pause is younger than
    ``QUEUE_PAUSE_REFRESH_S`` plus a margin, until every worker has read it; and for the outbox
    rows a relay is sending at that moment (at most ``OUTBOX_LEASE_S``), which are then taken on
    the broker. Raises ``QueueNotPausable`` (not a queue of this project), ``QueueNotPaused``, and
    the database's and broker's errors: what was taken before one is recorded, the rest waits as
    it did."""
    pause = _paused(name)
    settled_at = pause.changed_at + timedelta(seconds=float(conf.QUEUE_PAUSE_REFRESH_S) + PAUSE_READ_MARGIN_S)
    if (wait_s := (settled_at - timezone.now()).total_seconds()) > 0:
        time.sleep(wait_s)
    said = f"purged from queue {name} by {by}" + (f": {reason}" if reason else "")
    failure = Failure(PURGED_ERROR_CLASS, said, "")
    broker = configured_broker()

    def take_broker() -> int:
        taken = 0
        for queue in (name, dq_name(name)):
            # What waits now, not what publishers add while the purge runs (the queue is paused,
            # publishing is not).
            taken += take_waiting(broker, queue, lambda bodies: _record(bodies, failure, name),
                                  limit=_ready_count(broker, queue))
        return taken

    # The broker first: a key's messages there went out before its rows still in the outbox, and
    # a group is replayed in dead letter order (deadletters replay, the admin's action).
    from_broker = take_broker()
    from_outbox, taken_meanwhile = _purge_outbox(name, failure, take_broker)
    from_broker += taken_meanwhile + take_broker()  # and what relays sent meanwhile
    counts = _held_by_workers(broker, name)
    if user is not None and apps.is_installed("django.contrib.admin"):
        from django.contrib.admin.models import CHANGE, LogEntry  # an API-only project has no admin

        LogEntry.objects.log_actions(user.pk, [pause], CHANGE, single_object=True, change_message=(
            f"Purged {from_outbox + from_broker} waiting messages into dead letters{': ' + reason if reason else ''}"))
    log.warning("queue purged", queue=name, by=by, reason=reason, from_outbox=from_outbox,
                from_broker=from_broker, held_by_workers=counts)
    return PurgeResult(name, from_outbox, from_broker, counts)


_UNSENT = (OutboxMessage.Status.PENDING, OutboxMessage.Status.HELD)


def _purge_outbox(name: str, failure: Failure, take_broker: Callable[[], int]) -> tuple[int, int]:
    """Move the queue's unsent outbox rows committed before now into dead letters, a batch per
    transaction; returns how many, and how many broker messages ``take_broker`` took meanwhile.
    A row a relay has leased is left to it: it reaches the broker, where ``take_broker`` takes it
    before the rows of its key behind it (so a key's letters keep its publish order); should that
    relay die, the row is taken here once its lease runs out."""
    last_id = OutboxMessage.objects.filter(queue_name=name).order_by("-id").values_list("id", flat=True).first()
    if last_id is None:
        return 0, 0
    unsent = OutboxMessage.objects.filter(queue_name=name, status__in=_UNSENT, id__lte=last_id)
    taken = from_broker = 0
    in_flight: set[int] = set()
    deadline = time.monotonic() + float(conf.OUTBOX_LEASE_S) + 1
    while True:
        # The oldest rows, this round's: a relay leases oldest first, so its leases are among them.
        window = list(unsent.order_by("id").values_list("id", flat=True)[:OUTBOX_BATCH])
        if not window:
            return taken, from_broker
        leased = set(unsent.filter(id__lte=window[-1], claimed_until__gte=Now()).values_list("id", flat=True))
        if in_flight - leased:
            # Sent (or given back) since the last look: its message is on the broker now.
            from_broker += take_broker()
        in_flight = leased
        # A row waits while an older row of its key is leased, or was when last looked (it may
        # have reached the broker since, not yet taken there).
        ahead = OutboxMessage.objects.filter(queue_name=name, key=OuterRef("key"), id__lt=OuterRef("id")).filter(
            Q(status__in=_UNSENT, claimed_until__gte=Now()) | Q(id__in=leased))
        with transaction.atomic():
            rows = list(unsent.filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=Now()), id__lte=window[-1])
                        .exclude(Exists(ahead)).select_for_update(skip_locked=True).order_by("id")[:OUTBOX_BATCH])
            if rows:
                _record_rows(rows, failure)
                OutboxMessage.objects.filter(id__in=[row.id for row in rows]).delete()
                taken += len(rows)
                deadline = time.monotonic() + float(conf.OUTBOX_LEASE_S) + 1
                continue
        # Rows a relay leased or locked, or rows behind them: sent within moments, or claimable
        # once their lease ends.
        if time.monotonic() > deadline:
            return taken, from_broker
        time.sleep(0.05)


def _record_rows(rows: Sequence[OutboxMessage], failure: Failure) -> None:
    now_s = time.time()
    messages = [ClaimedMessage(id=row.id, actor_name=row.actor_name, queue_name=row.queue_name, payload=row.payload,
                               key=row.key, headers=row.headers or {}, delay_s=None,
                               created_at=row.created_at).to_message(now_s)[0] for row in rows]
    _create(messages, failure)


def _record(bodies: Sequence[bytes], failure: Failure, queue: str) -> None:
    _create([_decoded(body, queue) for body in bodies], failure)


# A dead letter's actor and message id columns; a message whose own do not fit, or whose parts
# are not what a dead letter records, is kept as text.
_ID_CHARS = 255


def _decoded(body: bytes, queue: str) -> Message[Any]:
    try:
        message = Message.decode(body)
        if (len(str(message.actor_name)) <= _ID_CHARS and len(str(message.message_id)) <= _ID_CHARS
                and isinstance(message.kwargs, dict) and isinstance(message.args, list | tuple)
                and isinstance(message.options, dict) and type(message.options.get("retries", 0)) is int):
            return message
    except Exception:
        pass
    # Kept as text, not dropped, nor left held to fail every later purge: the letter says what
    # the broker held.
    digest = hashlib.blake2b(body, digest_size=16).hexdigest()  # the same id should a purge record it again
    return Message(queue_name=queue, actor_name="", args=(), options={},
                   kwargs={"unreadable_body": body.decode(errors="replace")[:10_000]},
                   message_id=f"unreadable-{digest}", message_timestamp=int(time.time() * 1000))


def _create(messages: Sequence[Message[Any]], failure: Failure) -> None:
    now = timezone.now()
    letters = [DeadLetter(message_id=message.message_id, first_failed_at=now, last_failed_at=now,
                          **dead_letter_fields(message, failure, int(message.options.get("retries", 0))))
               for message in messages]
    # A message recorded by a purge that died before the broker let it go is not recorded twice.
    with transaction.atomic():
        DeadLetter.objects.bulk_create(letters, ignore_conflicts=True)


def _held_by_workers(broker: Any, name: str) -> int | None:
    counts = broker_counts(name, broker)
    return None if counts.in_flight is None else counts.in_flight + counts.delayed
