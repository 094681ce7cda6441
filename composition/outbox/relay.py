"""The relay: claim pending outbox rows, enqueue them to Dramatiq, mark them sent.

One batch is three short steps, and only the first holds row locks: claim (``FOR UPDATE SKIP
LOCKED`` with a lease, in its own transaction), enqueue in id order in one broker round trip with no
transaction open, mark sent. The statements are in ``composition.outbox.claims``; ``Relay`` is the
loop (one batch, until idle, a bounded round shared by concurrent callers).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import structlog
from dramatiq.actor import Actor
from dramatiq.broker import Broker

from composition.broker.time_limits import shielded
from composition.conf import conf
from composition.errors import described
from composition.metrics import OUTBOX_RELAY_ERRORS, OUTBOX_RELAY_LAG_SECONDS, OUTBOX_RELAYED
from composition.outbox.claims import ClaimedMessage, claim, mark_sent, move_to_queue, release
from composition.outbox.claims import confirm as confirm_claims
from composition.outbox.enqueue import enqueue_many
from composition.outbox.held import release_due
from composition.outbox.leases import LeaseKeeper
from composition.outbox.relay_actor import (
    DEAD_LETTER_OPTION,
    NUDGE_MAX_AGE_S,
    RELAY_ACTOR_NAME,
    RELAY_QUEUE_NAME,
    declare_relay_actor,
)

__all__ = [
    "DEAD_LETTER_OPTION",
    "NUDGE_MAX_AGE_S",
    "RELAY_ACTOR_NAME",
    "RELAY_QUEUE_NAME",
    "ClaimedMessage",
    "Relay",
    "RelayRound",
    "SentAfterCommit",
    "relay_actor",
    "relay_for",
]

log = structlog.get_logger("composition.outbox.relay")

# Rows inserted leased are sent without confirming them first only while less than this share of
# their lease has passed since the insert (a long transaction's rows are confirmed, and renewed).
_SEND_UNCONFIRMED_SHARE = 0.5


@dataclass(frozen=True)
class RelayRound:
    """What one bounded relay round did: messages relayed, and whether the outbox was left idle
    (False: time ran out with work remaining, to be handed on)."""

    relayed: int
    finished: bool


@dataclass(frozen=True)
class SentAfterCommit:
    """What a send right after COMMIT did: the ids it sent, and whether a pending row of one of
    their keys waits behind them (its own send found them in flight: the relay is to be woken)."""

    ids: set[int]
    followers_waiting: bool = False


class Relay:
    """Relays pending outbox rows to ``broker``. Thread-safe; one per process is plenty.

    ``batch_size`` and ``lease_s`` default to ``OUTBOX_BATCH_SIZE`` and ``OUTBOX_LEASE_S``.
    """

    def __init__(self, broker: Broker, *, batch_size: int | None = None, lease_s: float | None = None,
                 relay_id: str | None = None) -> None:
        self.broker = broker
        self._batch_size = batch_size
        self._lease_s = lease_s
        self.pid = os.getpid()
        self.relay_id = relay_id or f"{socket.gethostname()}:{self.pid}:{uuid.uuid4().hex[:8]}"
        self._running = threading.Lock()
        self._again = threading.Event()
        self.leases = LeaseKeeper(self.relay_id)

    @property
    def batch_size(self) -> int:
        return self._batch_size or int(conf.OUTBOX_BATCH_SIZE)

    @property
    def lease_s(self) -> float:
        return self._lease_s or float(conf.OUTBOX_LEASE_S)

    # -- one batch -------------------------------------------------------------------------------
    def claim(self, limit: int | None = None, *, only_ids: Sequence[int] | None = None) -> list[ClaimedMessage]:
        """Lease up to ``limit`` claimable rows (one short transaction); oldest first. With
        ``only_ids``, only those can head a batch (see ``claims.claim``)."""
        return claim(limit=limit or self.batch_size, lease_s=self.lease_s, relay_id=self.relay_id,
                     only_ids=only_ids)

    def run_once(self, limit: int | None = None) -> int:
        """Claim, enqueue and mark one batch; return how many messages were relayed.

        When the broker fails, the batch's claims are released (with the error recorded on the
        rows) and the broker's exception propagates. A batch is never cut by a job time limit
        (the relay actor's included): an interrupt between enqueue and mark-sent would send the
        batch twice, so it waits until the batch is done.
        """
        # A row waiting behind this batch's keys is the next claim's head: the loop that called
        # this goes round again until a claim finds nothing.
        with shielded():
            return len(self._run_batch(limit)[0])

    def relay_published(self, ids: Sequence[int]) -> SentAfterCommit:
        """Relay the rows ``ids`` that a transaction just committed, now, without waiting for a
        relay round: the one hop from COMMIT to the broker. Says which of ``ids`` were sent;
        the others (a row whose key has an older row still pending, or one another relay holds)
        are left to the relay. Raises, after releasing its claims, when the broker fails."""
        sent: set[int] = set()
        followers_waiting = False
        wanted = set(ids)
        while wanted - sent:
            with shielded():
                claimed, waiting = self._run_batch(None, only_ids=sorted(wanted - sent))
            followers_waiting = followers_waiting or waiting
            if not claimed:
                break
            sent |= wanted.intersection(message.id for message in claimed)
        return SentAfterCommit(sent, followers_waiting)

    def send_claimed(self, messages: Sequence[ClaimedMessage], *, since: float,
                     confirm: bool = False) -> SentAfterCommit:
        """Send rows that a transaction inserted already leased to this relay
        (``claims.insert``), right after its COMMIT; return the ids sent.

        ``since`` is a ``time.monotonic()`` value taken before the first of them was inserted
        (their leases began after it). With no database round trip before the broker's when it
        can: only rows with a key (an older row of the key that a concurrent transaction
        committed meanwhile must go first), rows inserted under a savepoint (``confirm``: it may
        have been rolled back) and rows whose lease may be running out are first confirmed
        (``claims.confirm``), and those an older row of their key now precedes are given back to
        the relay. Raises, after releasing the rows, when the broker fails.
        """
        if not messages:
            return SentAfterCommit(set())
        if confirm or time.monotonic() - since > self.lease_s * _SEND_UNCONFIRMED_SHARE:
            to_confirm = [message.id for message in messages]
        else:
            to_confirm = [message.id for message in messages if message.key is not None]
        if to_confirm:
            since = time.monotonic()
            confirmed = confirm_claims(to_confirm, lease_s=self.lease_s, relay_id=self.relay_id)
            unconfirmed = set(to_confirm)
            messages = [message for message in messages
                        if message.id not in unconfirmed or confirmed.get(message.id) is False]
        if not messages:
            return SentAfterCommit(set())
        with shielded():
            followers_waiting = self._enqueue_and_mark(sorted(messages, key=lambda message: message.id), since=since)
        return SentAfterCommit({message.id for message in messages}, followers_waiting)

    def release_claimed(self, ids: Sequence[int], *, error: str) -> None:
        """Give back rows this relay holds (``claims.release``), for any relay to claim at once."""
        release(ids, error=error[:2000], relay_id=self.relay_id)

    def _run_batch(self, limit: int | None, *,
                   only_ids: Sequence[int] | None = None) -> tuple[list[ClaimedMessage], bool]:
        """The claimed batch, and whether a pending row of its keys waits behind it."""
        since = time.monotonic()
        claimed = self.claim(limit, only_ids=only_ids)
        followers_waiting = bool(claimed) and self._enqueue_and_mark(claimed, since=since)
        return claimed, followers_waiting

    def _enqueue_and_mark(self, claimed: Sequence[ClaimedMessage], *, since: float) -> bool:
        """Enqueue and mark one claimed batch; True when a pending row of one of its keys waits
        behind it (``claims.mark_sent``)."""
        # The rows' leases are renewed for as long as the batch takes (composition.outbox.leases).
        ids = [message.id for message in claimed]
        with self.leases.holding(ids, lease_s=self.lease_s, since=since):
            claimed = self._routed(claimed)
            now_s = time.time()
            try:
                enqueue_many(self.broker, [message.to_message(now_s) for message in claimed])
            except Exception as exc:
                OUTBOX_RELAY_ERRORS.inc()
                error = described(exc)[:2000]
                log.error("outbox relay could not enqueue a batch; claims released", count=len(ids), error=error)
                release(ids, error=error, relay_id=self.relay_id)
                raise
            enqueued_s = time.time()
            followers_waiting = mark_sent(ids, sent_at=datetime.fromtimestamp(enqueued_s, tz=UTC),
                                          relay_id=self.relay_id,
                                          keyed=any(message.key is not None for message in claimed))
        for actor_name, count in Counter(message.actor_name for message in claimed).items():
            OUTBOX_RELAYED.labels(actor_name).inc(count)
        for message in claimed:
            # A released held row has waited since it came due, not since it was published.
            waited_from = message.due_at or message.created_at
            OUTBOX_RELAY_LAG_SECONDS.observe(max(0.0, enqueued_s - waited_from.timestamp()))
        return followers_waiting

    def _routed(self, claimed: Sequence[ClaimedMessage]) -> Sequence[ClaimedMessage]:
        """``claimed``, each on its job's queue as this code declares it. A deploy may have moved
        the job since the row was written (a held row's, days ago), and workers read only the
        queues their code declares: the old one may have no reader left. The row records it."""
        moved: dict[str, list[int]] = {}
        routed = []
        for message in claimed:
            actor = self.broker.actors.get(message.actor_name)
            if actor is not None and actor.queue_name != message.queue_name:
                moved.setdefault(actor.queue_name, []).append(message.id)
                message = replace(message, queue_name=actor.queue_name)
            routed.append(message)
        for queue_name, ids in moved.items():
            move_to_queue(ids, queue_name, relay_id=self.relay_id)
        return routed

    # -- loops -----------------------------------------------------------------------------------
    def run_until_idle(self, *, max_s: float | None = None) -> int:
        """Release held rows that came due, then run batches until a claim finds nothing (or
        ``max_s`` seconds pass); return the count."""
        release_due()
        deadline = None if max_s is None else time.monotonic() + max_s
        total = 0
        while True:
            relayed = self.run_once()
            total += relayed
            if relayed == 0 or (deadline is not None and time.monotonic() >= deadline):
                return total

    def run_coalesced_round(self, *, max_s: float) -> RelayRound:
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


# -- this process's relay per broker -------------------------------------------------------------
_relays_lock = threading.Lock()
# Keyed by the broker itself (brokers hash by identity), so no id() can be reused. Not a
# WeakKeyDictionary: the Relay holds its broker, so a weak key would never die either; an entry
# lasts as long as the process, as the relay actor declared on that broker does.
_relays: dict[Broker, Relay] = {}


def relay_for(broker: Broker) -> Relay:
    """This process's relay for ``broker`` (shared by the actor and the sweeper)."""
    with _relays_lock:
        relay = _relays.get(broker)
        # A forked child gets a relay of its own: its leases must not pass for its parent's.
        if relay is None or relay.pid != os.getpid():
            relay = _relays[broker] = Relay(broker)
        return relay


def relay_actor(broker: Broker) -> Actor[[], None]:
    """The relay actor declared on ``broker`` (declared on first call, then reused).

    A message to it (the after-commit nudge) makes a worker run this process's relay for a
    bounded round (``Relay.run_coalesced_round``); the sweeper in ``runworkers`` covers nudges
    that were lost.
    """
    relay = relay_for(broker)
    return declare_relay_actor(broker, lambda max_s: relay.run_coalesced_round(max_s=max_s).finished)
