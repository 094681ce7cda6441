"""What runs right after a publishing transaction commits, on the committing thread.

``SendAfterCommit`` sends the rows the transaction published in one broker round trip and marks
them sent in one UPDATE; ``nudge()`` wakes the relay for the rest; a transaction has one of each
(``send_after_commit``, ``nudge_after_commit``). Both go through the broker's nudge breaker and
never raise: the commit has succeeded, and the sweep relays whatever was missed.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import suppress
from functools import partial

import structlog
from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.transaction import TransactionManagementError
from dramatiq.broker import Broker

from composition.breaker import CircuitBreaker, CircuitOpen
from composition.broker.configured import configured_broker
from composition.db.transactions import on_commit_once, open_savepoints, savepoint_outside_atomic
from composition.errors import BROKER_FAILURES, described
from composition.outbox.claims import ClaimedMessage
from composition.outbox.enqueue import is_rabbitmq
from composition.outbox.relay import Relay, SentAfterCommit, relay_actor, relay_for

__all__ = ["BROKER_FAILURES", "NUDGE_BREAKER_FAILURES", "NUDGE_BREAKER_RESET_S", "SendAfterCommit",
           "committing_transaction", "nudge", "nudge_after_commit", "nudge_breaker", "send_after_commit",
           "under_savepoint"]

log = structlog.get_logger("composition.outbox")

# One failed nudge opens the broker's nudge circuit: a frozen broker then costs the one commit
# that found it one socket timeout, not every commit one. After NUDGE_BREAKER_RESET_S a probe on
# a thread of its own (a relay nudge) tries the broker: a caller's trial call would have held one
# request per process for a socket timeout every NUDGE_BREAKER_RESET_S of the outage.
NUDGE_BREAKER_FAILURES = 1
NUDGE_BREAKER_RESET_S = 5.0

# The keys of a transaction's one send and one nudge after COMMIT (see on_commit_once).
_SEND_KEY = "composition.outbox.send_after_commit"
_NUDGE_KEY = "composition.outbox.nudge"

_breakers_lock = threading.Lock()
_breakers: weakref.WeakKeyDictionary[Broker, CircuitBreaker] = weakref.WeakKeyDictionary()


def nudge_breaker(broker: Broker) -> CircuitBreaker:
    """The circuit breaker of ``broker``'s relay nudges in this process (one per broker)."""
    with _breakers_lock:
        breaker = _breakers.get(broker)
        if breaker is None:
            # What opens it: the broker failing (BROKER_FAILURES). A database error of the
            # after-commit send (a restarting PostgreSQL) says nothing about the broker and must
            # not pause sends that would work.
            breaker = CircuitBreaker("outbox_nudge", failure_threshold=NUDGE_BREAKER_FAILURES,
                                     reset_timeout_s=NUDGE_BREAKER_RESET_S, failure_types=BROKER_FAILURES,
                                     probe=partial(_probe_with_nudge, weakref.ref(broker)))
            _breakers[broker] = breaker
        return breaker


def _probe_with_nudge(broker_ref: weakref.ref[Broker]) -> None:
    """The nudge breaker's probe: a relay nudge, which also has the relay take what the outage
    left pending. Raises the broker's error. Weak: the breaker must not keep its broker alive."""
    broker = broker_ref()
    if broker is None:
        return
    try:
        relay_actor(broker).send()
    finally:
        if is_rabbitmq(broker):
            # It keeps a connection per thread until that is closed, and this thread ends now.
            with suppress(Exception):
                del broker.connection


# On the committing thread: a per-process thread batching many transactions' sends was no faster
# end to end (bench/bench_throughput.py), cost more CPU per job, and lost what a killed process
# had not sent yet until the lease ran out.
class SendAfterCommit:
    """The rows one transaction published, sent to the broker once it has committed."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        # The rows inserted leased to ``relay`` (this process's relay for the broker), in order;
        # the others are claimed after COMMIT.
        self.relay: Relay | None = None
        self.claimed: list[ClaimedMessage] = []
        self.claimed_ids: list[int] = []
        self.claimed_by_key: dict[str, list[int]] = {}
        self.since = 0.0
        self.confirm = False

    def add_claimed(self, message: ClaimedMessage, *, since: float, under_savepoint: bool) -> None:
        if not self.claimed:
            self.since = since
        self.claimed.append(message)
        self.claimed_ids.append(message.id)
        if message.key is not None:
            self.claimed_by_key.setdefault(message.key, []).append(message.id)
        # A savepoint open at the insert may still be rolled back: confirm the rows exist first.
        self.confirm = self.confirm or under_savepoint

    def __call__(self) -> None:
        """After COMMIT: send the rows from this thread. Never raises: the caller's commit has
        succeeded whatever happens here."""
        if not transaction.get_connection(DEFAULT_DB_ALIAS).in_atomic_block:
            # Django only ever counts savepoints up; none is open now, and a count left above
            # zero would have every later publish of this thread confirm its rows
            # (composition.db.transactions.savepoint_outside_atomic).
            transaction.clean_savepoints(DEFAULT_DB_ALIAS)
        if not self.ids:
            return
        sent: set[int] = set()
        followers_waiting = False
        try:
            broker = configured_broker()
            relay = self.relay or relay_for(broker)
            breaker = nudge_breaker(broker)
            if self.claimed:
                result: SentAfterCommit = breaker.call(relay.send_claimed, self.claimed, since=self.since,
                                                       confirm=self.confirm)
                sent |= result.ids
                followers_waiting = result.followers_waiting
            claimed = set(self.claimed_ids)
            rest = [pk for pk in self.ids if pk not in claimed]
            if rest:
                result = breaker.call(relay.relay_published, rest)
                sent |= result.ids
                followers_waiting = followers_waiting or result.followers_waiting
        except CircuitOpen as exc:
            log.debug("outbox send after commit skipped, the broker is failing; the sweep will relay it",
                      retry_after_s=round(exc.retry_after_s, 2))
            self._give_back(sent, "not sent after commit: the broker is failing")
            return
        except Exception as exc:
            # A broker failure released the rows already; a database failure leaves them leased
            # until the lease runs out.
            log.warning("outbox send after commit failed; the sweep will relay it",
                        error=described(exc))
            return
        if len(sent) < len(self.ids) or followers_waiting:
            # Rows that wait behind an older row of their key (or were rolled back with a
            # savepoint): the relay takes the key's rows in order once its head has gone. And
            # rows of another transaction that waited behind these: their own nudge may have
            # found these still in flight, so the relay is woken again now that they are sent.
            nudge()

    def _give_back(self, sent: set[int], error: str) -> None:
        """Release the rows inserted leased and not sent, so the sweep need not wait out the lease."""
        unsent = [pk for pk in self.claimed_ids if pk not in sent]
        if not unsent or self.relay is None:
            return
        try:
            self.relay.release_claimed(unsent, error=error)
        except Exception as exc:
            log.warning("could not release outbox rows not sent after commit; the sweep relays them once "
                        "their lease runs out", error=described(exc))


def nudge() -> None:
    """Ask the relay to run now, through the broker's nudge breaker; never raises. After commit the
    row is safe and a failed nudge only delays it until the next sweep, so it must never turn the
    caller's successful commit into an exception."""
    try:
        broker = configured_broker()
        nudge_breaker(broker).call(relay_actor(broker).send)
    except CircuitOpen as exc:
        log.debug("outbox relay nudge skipped, the broker is failing; the sweep will relay the message",
                  retry_after_s=round(exc.retry_after_s, 2))
    except Exception as exc:
        log.warning("outbox relay nudge failed; the sweep will relay the message",
                    error=described(exc))


# -- what a publish registers ------------------------------------------------------------------
def committing_transaction(caller: str) -> bool:
    """Whether a transaction is open (``atomic``) on the default database: False in autocommit.
    Raises ``TransactionManagementError`` under manual transaction management, where nothing says
    when it commits, so nothing can be sent after it, and sending now could send a row that is
    then rolled back."""
    connection = transaction.get_connection(DEFAULT_DB_ALIAS)
    if not connection.in_atomic_block and not connection.get_autocommit():
        raise TransactionManagementError(f"{caller} cannot be used in manual transaction management "
                                         "(autocommit off outside atomic): use transaction.atomic()")
    return bool(connection.in_atomic_block)


def send_after_commit(in_transaction: bool) -> tuple[SendAfterCommit, Relay]:
    """The transaction's one send after COMMIT, however many rows it publishes (a new one, to be
    called by the caller, in autocommit), and this process's relay for the configured broker: rows
    inserted leased to it when it is the send's relay need no claim after COMMIT."""
    send = on_commit_once(_SEND_KEY, SendAfterCommit(), using=DEFAULT_DB_ALIAS) if in_transaction \
        else SendAfterCommit()
    relay = relay_for(configured_broker())
    if send.relay is None:
        send.relay = relay
    return send, relay


def nudge_after_commit() -> None:
    """Nudge the relay once after COMMIT: a transaction publishing thousands of rows needs one
    nudge, not thousands."""
    on_commit_once(_NUDGE_KEY, nudge, using=DEFAULT_DB_ALIAS)


def under_savepoint() -> bool:
    """Whether what is written now may still be rolled back by a savepoint (then the send after
    COMMIT confirms the rows exist first)."""
    return any(sid is not None for sid in open_savepoints(DEFAULT_DB_ALIAS)) \
        or savepoint_outside_atomic(DEFAULT_DB_ALIAS)
