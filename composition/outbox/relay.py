"""The relay: claim pending outbox rows, enqueue them to Dramatiq, mark them sent.

One batch is three short steps, and only the first holds row locks:

1. claim (one statement, its own transaction): lock up to ``batch_size`` claimable rows with
   ``FOR UPDATE SKIP LOCKED`` and give them a lease (``claimed_until``);
2. enqueue them in id order with one batched broker round trip (no database transaction open);
3. mark them sent (one ``UPDATE``).

A row is claimable when it is pending, its lease is absent or expired, and it is the oldest
pending row of its key. ``SKIP LOCKED`` skips a locked head row, so a key's later rows are never
taken on their own: they ride along only in the batch of the relay that holds the key's head,
which enqueues them in order. Nothing keeps an id cursor (ids are allocated at insert, not at
commit), so a row that commits late is still found. A relay that crashes after step 1 leaves
leased rows that are claimed again once the lease expires: at least once, never lost.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dramatiq
import structlog
from django.db import close_old_connections, connection, transaction
from dramatiq.actor import Actor
from dramatiq.broker import Broker
from dramatiq.errors import ActorNotFound
from dramatiq.message import Message

from composition.conf import conf
from composition.metrics import OUTBOX_RELAY_ERRORS, OUTBOX_RELAY_LAG_SECONDS, OUTBOX_RELAYED
from composition.outbox.enqueue import enqueue_many
from composition.outbox.models import OutboxMessage, message_id_for
from composition.time_limits import shielded

__all__ = [
    "RELAY_ACTOR_NAME", "RELAY_QUEUE_NAME", "ClaimedMessage", "Relay", "RelayRound", "relay_actor", "relay_for",
]

log = structlog.get_logger("composition.outbox.relay")

RELAY_ACTOR_NAME = "composition_outbox_relay"
# Its own queue, so a nudge never waits behind slow business jobs.
RELAY_QUEUE_NAME = "composition.outbox"
# A nudge older than this is dropped unrun: the sweep has long relayed whatever it was about.
NUDGE_MAX_AGE_S = 60.0
# The actor option (composition.jobs.middleware.DEAD_LETTER_OPTION) that turns dead letters off;
# spelled here so the outbox does not import the jobs package.
DEAD_LETTER_OPTION = "dead_letter"

_CLAIM_SQL = """
WITH heads AS (
    SELECT o.id, o.key
    FROM {table} o
    WHERE o.status = 'pending'
      AND (o.claimed_until IS NULL OR o.claimed_until < now())
      AND (o.key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {table} p
            WHERE p.status = 'pending' AND p.key = o.key AND p.id < o.id))
    ORDER BY o.id
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
), followers AS (
    SELECT o.id
    FROM {table} o JOIN heads h ON o.key = h.key
    WHERE o.status = 'pending' AND o.id > h.id
      AND (o.claimed_until IS NULL OR o.claimed_until < now())
    ORDER BY o.id
    LIMIT %(limit)s
), picked AS (
    -- Cutting the union in id order keeps, for every key, a prefix of its pending rows.
    SELECT id FROM (SELECT id FROM heads UNION ALL SELECT id FROM followers) u
    ORDER BY id
    LIMIT %(limit)s
)
UPDATE {table} t
SET claimed_until = now() + make_interval(secs => %(lease_s)s),
    claimed_by = %(relay_id)s,
    attempts = t.attempts + 1
FROM picked
WHERE t.id = picked.id AND t.status = 'pending'
RETURNING t.id, t.actor_name, t.queue_name, t.payload, t.key, t.headers, t.delay_s, t.created_at
"""

_MARK_SENT_SQL = """
UPDATE {table} SET status = 'sent', sent_at = %(sent_at)s, claimed_until = NULL, last_error = ''
WHERE id = ANY(%(ids)s) AND status = 'pending'
"""

_RELEASE_SQL = """
UPDATE {table} SET claimed_until = NULL, last_error = %(error)s
WHERE id = ANY(%(ids)s) AND status = 'pending' AND claimed_by = %(relay_id)s
"""


@dataclass(frozen=True)
class RelayRound:
    """What one bounded relay round did: messages relayed, and whether the outbox was left idle
    (False: time ran out with work remaining, to be handed on)."""

    relayed: int
    finished: bool


@dataclass(frozen=True)
class ClaimedMessage:
    """One claimed outbox row, as much of it as the relay needs."""

    id: int
    actor_name: str
    queue_name: str
    payload: dict[str, Any]
    key: str | None
    headers: dict[str, Any]
    delay_s: float | None
    created_at: datetime

    def to_message(self, now_s: float) -> tuple[Message[Any], int | None]:
        """The Dramatiq message (args=(), kwargs=payload) and its delay in ms (None: due now)."""
        delay_ms = None
        if self.delay_s:
            remaining_s = self.created_at.timestamp() + self.delay_s - now_s
            if remaining_s > 0:
                delay_ms = int(remaining_s * 1000)
        headers = {**self.headers, "outbox_id": self.id, "key": self.key}
        message: Message[Any] = Message(
            queue_name=self.queue_name, actor_name=self.actor_name, args=(), kwargs=self.payload,
            options={"composition": headers}, message_id=message_id_for(self.id),
            message_timestamp=int(now_s * 1000),
        )
        return message, delay_ms


def _relaxed(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run one relay statement in its own short transaction without waiting for the WAL flush.

    The relay's own bookkeeping (leases, sent marks) needs no durability: if a server crash
    loses the last few such commits, the rows are simply claimed and relayed again, which the
    relay's at-least-once contract (and the inbox ledger behind it) already covers. Not waiting
    for two fsyncs per batch is most of the relay's throughput on a real disk.
    """
    # Inside a caller's transaction the setting would cover the caller's own commit: leave it.
    relax = not connection.in_atomic_block
    with transaction.atomic(), connection.cursor() as cursor:
        if relax:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _decode_json(value: Any) -> Any:
    # psycopg returns jsonb decoded; a raw cursor on another driver might hand back text.
    if isinstance(value, str | bytes):
        return json.loads(value)
    return value


class Relay:
    """Relays pending outbox rows to ``broker``. Thread-safe; one per process is plenty.

    ``batch_size`` and ``lease_s`` default to ``OUTBOX_BATCH_SIZE`` and ``OUTBOX_LEASE_S``.
    """

    def __init__(self, broker: Broker, *, batch_size: int | None = None, lease_s: float | None = None,
                 relay_id: str | None = None) -> None:
        self.broker = broker
        self._batch_size = batch_size
        self._lease_s = lease_s
        self.relay_id = relay_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._running = threading.Lock()
        self._again = threading.Event()

    @property
    def batch_size(self) -> int:
        return self._batch_size or int(conf.OUTBOX_BATCH_SIZE)

    @property
    def lease_s(self) -> float:
        return self._lease_s or float(conf.OUTBOX_LEASE_S)

    # -- one batch -------------------------------------------------------------------------------
    def claim(self, limit: int | None = None) -> list[ClaimedMessage]:
        """Lease up to ``limit`` claimable rows (one short transaction); oldest first."""
        table = connection.ops.quote_name(OutboxMessage._meta.db_table)
        rows = _relaxed(_CLAIM_SQL.format(table=table), {
            "limit": limit or self.batch_size, "lease_s": self.lease_s, "relay_id": self.relay_id})
        claimed = [ClaimedMessage(id=row[0], actor_name=row[1], queue_name=row[2],
                                  payload=_decode_json(row[3]), key=row[4], headers=_decode_json(row[5]) or {},
                                  delay_s=row[6], created_at=row[7]) for row in rows]
        claimed.sort(key=lambda message: message.id)
        return claimed

    def run_once(self, limit: int | None = None) -> int:
        """Claim, enqueue and mark one batch; return how many messages were relayed.

        When the broker fails, the batch's claims are released (with the error recorded on the
        rows) and the broker's exception propagates. A batch is never cut by a job time limit
        (the relay actor's included): an interrupt between enqueue and mark-sent would send the
        batch twice, so it waits until the batch is done.
        """
        with shielded():
            return self._run_batch(limit)

    def _run_batch(self, limit: int | None) -> int:
        claimed = self.claim(limit)
        if not claimed:
            return 0
        table = connection.ops.quote_name(OutboxMessage._meta.db_table)
        ids = [message.id for message in claimed]
        now_s = time.time()
        try:
            enqueue_many(self.broker, [message.to_message(now_s) for message in claimed])
        except Exception as exc:
            OUTBOX_RELAY_ERRORS.inc()
            error = f"{type(exc).__name__}: {exc}"[:2000]
            log.error("outbox relay could not enqueue a batch; claims released", count=len(ids), error=error)
            with connection.cursor() as cursor:
                cursor.execute(_RELEASE_SQL.format(table=table),
                               {"ids": ids, "error": error, "relay_id": self.relay_id})
            raise
        enqueued_s = time.time()
        _relaxed(_MARK_SENT_SQL.format(table=table), {
            "ids": ids, "sent_at": datetime.fromtimestamp(enqueued_s, tz=UTC)})
        for actor_name, count in Counter(message.actor_name for message in claimed).items():
            OUTBOX_RELAYED.labels(actor_name).inc(count)
        for message in claimed:
            OUTBOX_RELAY_LAG_SECONDS.observe(max(0.0, enqueued_s - message.created_at.timestamp()))
        return len(claimed)

    # -- loops -----------------------------------------------------------------------------------
    def run_until_idle(self, *, max_s: float | None = None) -> int:
        """Run batches until a claim finds nothing (or ``max_s`` seconds pass); return the count."""
        deadline = None if max_s is None else time.monotonic() + max_s
        total = 0
        while True:
            relayed = self.run_once()
            total += relayed
            if relayed == 0 or (deadline is not None and time.monotonic() >= deadline):
                return total

    def nudged(self, *, max_s: float) -> RelayRound:
        """Relay until idle, for at most ``max_s`` seconds (plus the batch under way), coalescing
        concurrent calls in this process.

        When another thread is already relaying, ask it to go round once more and return at
        once: a burst of nudges costs one claim loop, not one per nudge. A round that runs out of
        time while work remains returns ``finished=False``; the caller hands the rest on (a
        fresh nudge, the sweeper's next turn) instead of holding its thread.
        """
        self._again.set()
        if not self._running.acquire(blocking=False):
            return RelayRound(0, finished=True)
        deadline = time.monotonic() + max_s
        total = 0
        try:
            while self._again.is_set():
                self._again.clear()
                while True:
                    relayed = self.run_once()
                    total += relayed
                    if relayed == 0:
                        break
                    if time.monotonic() >= deadline:
                        return RelayRound(total, finished=False)
                if time.monotonic() >= deadline:
                    break
        finally:
            self._running.release()
        # A nudge that came in after our last look saw the lock held and left the work to us.
        return RelayRound(total, finished=not self._again.is_set())


# -- the relay actor ------------------------------------------------------------------------------
_declare_lock = threading.Lock()
_relays: dict[int, tuple[Broker, Relay]] = {}


def relay_for(broker: Broker) -> Relay:
    """This process's relay for ``broker`` (shared by the actor and the sweeper)."""
    with _declare_lock:
        entry = _relays.get(id(broker))
        if entry is None or entry[0] is not broker:
            entry = (broker, Relay(broker))
            _relays[id(broker)] = entry
        return entry[1]


def relay_actor(broker: Broker) -> Actor[[], None]:
    """The relay actor declared on ``broker`` (declared on first call, then reused).

    A message to it (the after-commit nudge) makes a worker run the relay until the outbox is
    idle; the sweeper in ``runworkers`` covers nudges that were lost.
    """
    relay = relay_for(broker)
    with _declare_lock:
        try:
            return broker.get_actor(RELAY_ACTOR_NAME)
        except ActorNotFound:
            pass

        def composition_outbox_relay() -> None:
            # Dramatiq threads never see request_finished: manage the connection per message.
            close_old_connections()
            try:
                round_ = relay.nudged(max_s=float(conf.OUTBOX_RELAY_BUDGET_S))
            finally:
                close_old_connections()
            if not round_.finished:
                # Give this worker thread back and let the next free one carry on; should the
                # send fail, the sweeper carries on within a sweep interval.
                try:
                    actor.send()
                except Exception as exc:
                    log.warning("could not hand the rest of the outbox on; the sweep will relay it",
                                error=f"{type(exc).__name__}: {exc}")

        options: dict[str, Any] = {}
        if any(DEAD_LETTER_OPTION in middleware.actor_options for middleware in broker.middleware):
            # A failed nudge (a database blip) is not work an operator should see or replay: the
            # rows it was about stay pending and the next nudge or sweep relays them.
            options[DEAD_LETTER_OPTION] = False
        declare = dramatiq.actor(
            actor_name=RELAY_ACTOR_NAME, queue_name=RELAY_QUEUE_NAME, broker=broker, max_retries=0,
            max_age=int(NUDGE_MAX_AGE_S * 1000), time_limit=int(float(conf.OUTBOX_RELAY_TIME_LIMIT_S) * 1000),
            **options,
        )
        actor: Actor[[], None] = declare(composition_outbox_relay)
        return actor
