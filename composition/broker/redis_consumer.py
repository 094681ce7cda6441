"""The consumer of ``composition.broker.redis.WakingRedisBroker`` (that module's doc says what
it adds to Dramatiq's): on an empty queue it waits on the wake list, ended at once by a new
message or its worker's stop (``end_waits``); it raises a Redis that stops answering as a lost
connection, and keeps its worker's ``Holdings`` (``composition.broker.redis_holdings``) so that
what a lost connection left unacknowledged with nobody holding it goes back to the queue. A delay
queue's consumer waits no longer than until the earliest delayed message it holds is due. While
its queue is paused (``composition.broker.pausing``) it fetches nothing, and a message marked
``hand_back()`` goes back to the queue instead of being acknowledged."""

from __future__ import annotations

import heapq
import math
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING
from uuid import uuid4

import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import current_millis
from dramatiq.errors import ConnectionClosed

from composition.broker.pausing import handed_back, paused_queues

if TYPE_CHECKING:
    from composition.broker.redis import WakingRedisBroker

__all__ = ["LOST_CONNECTION", "WAKE_SUFFIX", "WakingRedisConsumer", "consumer_of_this_thread", "end_waits",
           "has_wake_list", "wake_key"]

# A queue's wake list is "<namespace>:<queue><WAKE_SUFFIX>", beside Dramatiq's "<queue>.msgs".
WAKE_SUFFIX = ".wake"


def wake_key(broker: RedisBroker, queue_name: str) -> str:
    """The wake list of ``queue_name``."""
    return f"{broker.namespace}:{queue_name}{WAKE_SUFFIX}"


def has_wake_list(queue_name: str) -> bool:
    # Every queue a worker consumes, delay queues (".DQ") too; not the dead-letter ones (".XQ").
    return not queue_name.endswith(".XQ")


# What a lost connection looks like from redis-py: refused, reset, or no answer in time. Raised
# as itself, a timeout reached the consumer thread's generic handler, whose clean-up timed out
# too and ended the thread for good; as ConnectionClosed, Dramatiq restarts the consumer.
LOST_CONNECTION: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)
# An end_waits push that no wait popped (the consumer was not waiting) goes after this.
_STOP_TTL_MS = 10_000
# The consumer each of Dramatiq's consumer threads runs now. The thread also moves due delayed
# messages to their queues with broker.enqueue(), outside the consumer's calls.
_running = threading.local()


def consumer_of_this_thread() -> WakingRedisConsumer | None:
    """The consumer this thread runs, when it is one of Dramatiq's consumer threads."""
    consumer: WakingRedisConsumer | None = getattr(_running, "consumer", None)
    return consumer


@contextmanager
def _lost_as_closed() -> Iterator[None]:
    """Raise a lost connection as Dramatiq's ``ConnectionClosed`` (see the module doc)."""
    try:
        yield
    except LOST_CONNECTION as exc:
        raise ConnectionClosed(exc) from None


class WakingRedisConsumer(_RedisConsumer):
    """Dramatiq's Redis consumer that, when a fetch comes back empty, waits on the queue's wake
    list (for at most the broker's ``idle_wait_s``) instead of sleeping; a paused queue or a full
    prefetch looks again after ``timeout`` ms, as Dramatiq does. ``__next__`` returns ``None``
    after a wait, as Dramatiq's does after a sleep, so the consumer thread checks its stop flag
    then."""

    broker: WakingRedisBroker

    def __init__(self, broker: WakingRedisBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)
        self._wake_key = wake_key(broker, queue_name)
        self._wakes = has_wake_list(queue_name)
        # The Redis ids this worker's consumers of the queue hold (redis_holdings).
        self._held = broker.holdings.held(queue_name)
        # Redis id -> message handed out with an eta and not yet acked, nacked or requeued.
        self._delayed: dict[str, MessageProxy] = {}
        # (eta, Redis id) of those, earliest first; an entry no longer in _delayed is dropped
        # when it comes to the top.
        self._etas: list[tuple[int, str]] = []
        self._poll_ms = timeout
        # This consumer's own list, pushed to by end_waits: the wake list is every worker's.
        self._stop_key = f"{self._wake_key}.stop.{uuid4().hex}"
        self._ending = False  # set by end_waits: the worker is stopping
        self._woken = False  # a wake token ended the last wait, and no fetch has used it yet
        _running.consumer = self  # made by its consumer thread, which it serves until the next

    # __next__, ack and nack run for every message: they catch LOST_CONNECTION themselves rather than
    # through _lost_as_closed(), whose generator costs a few microseconds a message.
    def __next__(self) -> MessageProxy | None:
        try:
            try:
                self.broker.holdings.put_back_unheld(self.queue_name)
                message = self._next()
            except LOST_CONNECTION as exc:
                raise ConnectionClosed(exc) from None
        except ConnectionClosed:
            # A fetch may have run without its answer reaching us.
            self.connection_lost()
            raise
        if message is not None:
            options = message.options
            redis_id = options["redis_message_id"]
            self._held.add(redis_id)
            if "eta" in options:
                self._delayed[redis_id] = message
                eta = options["eta"]
                # Dramatiq runs one that is no number at once: so is it due here.
                due = eta if isinstance(eta, int | float) and math.isfinite(eta) else current_millis()
                heapq.heappush(self._etas, (int(due), redis_id))
        return message

    def connection_lost(self) -> None:
        """Its connection was lost, and its consumer thread drops the delayed messages it held
        (Dramatiq does on ``ConnectionClosed``): the queue's next consumer puts back what nobody
        holds."""
        self.broker.holdings.lost(self.queue_name, self._delayed)
        self._delayed.clear()

    def ack(self, message: MessageProxy) -> None:
        try:
            if handed_back(message):
                self._hand_back(message)
            else:
                super().ack(message)
        except LOST_CONNECTION as exc:
            raise ConnectionClosed(exc) from None
        redis_id = message.options["redis_message_id"]
        self._held.discard(redis_id)
        if self._delayed:
            self._delayed.pop(redis_id, None)

    def nack(self, message: MessageProxy) -> None:
        try:
            super().nack(message)
        except LOST_CONNECTION as exc:
            raise ConnectionClosed(exc) from None
        redis_id = message.options["redis_message_id"]
        self._held.discard(redis_id)
        if self._delayed:
            self._delayed.pop(redis_id, None)

    def _hand_back(self, message: MessageProxy) -> None:
        """Back to the end of its queue, by its Redis id (only while still unacknowledged here),
        in place of the acknowledgement."""
        try:
            self.broker.do_requeue(self.queue_name, message.options["redis_message_id"])
        finally:
            self.queued_message_ids.discard(message.message_id)

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        handed = list(messages)  # the thread's delay queue, drained by the generator
        ids = [message.options["redis_message_id"] for message in handed]
        try:
            with _lost_as_closed():
                super().requeue(handed)
        except ConnectionClosed:
            self.broker.holdings.lost(self.queue_name, ids)
            raise
        for redis_id in ids:
            self._held.discard(redis_id)
            self._delayed.pop(redis_id, None)

    def _next(self) -> MessageProxy | None:
        # Dramatiq's own path whenever it would not sleep on an empty queue: messages in the
        # cache, or a full prefetch (it sleeps, but a token could not be used).
        if self._wakes and self.queue_name in paused_queues and not self.message_cache:
            # Paused: fetch nothing; what was fetched before goes on to the worker threads, which
            # hand it back. Woken by a resume, or after one poll to check the stop flag.
            paused_queues.wait(self.broker.wait_s(self._poll_ms))
            return None
        if not self._wakes or self.message_cache or self.outstanding_message_count >= self.prefetch:
            # Dramatiq's sleep is at most self.timeout: until a held delayed message is due.
            self.timeout = self._until_next_due_ms(self._poll_ms)
            return super().__next__()
        # As Dramatiq fetches: dispatch.lua's fetch moves the ids into the unacked set. (A lost
        # connection here is raised as ConnectionClosed by __next__.)
        self.message_cache = self.broker.do_fetch(self.queue_name, self.prefetch - self.outstanding_message_count,
                                                  woken=self._woken)
        self._woken = False
        if not self.message_cache:
            self._wait_for_wake()
            return None
        return super().__next__()

    def _until_next_due_ms(self, longest_ms: int) -> int:
        """``longest_ms``, or less when a delayed message this consumer holds is due sooner."""
        etas = self._etas
        while etas and etas[0][1] not in self._delayed:
            heapq.heappop(etas)
        if not etas:
            return longest_ms
        return max(1, min(longest_ms, etas[0][0] - current_millis()))

    def _wait_for_wake(self) -> None:
        if self._ending:
            return
        wait_ms = self._until_next_due_ms(int(self.broker.idle_wait_s * 1000))
        try:
            # The stop list first: a stopping consumer takes its own token, not a message's.
            popped = self.broker.client.blpop([self._stop_key, self._wake_key], timeout=self.broker.wait_s(wait_ms))
        except redis.TimeoutError:
            # A late answer counts as one idle wait; redis-py dropped that connection already.
            return
        if popped is not None:
            key = popped[0]
            self._woken = (key.decode() if isinstance(key, bytes) else key) == self._wake_key

    def close(self) -> None:
        if self._woken:
            # A token this consumer took and will not use (its worker stops): another one's.
            self.broker.wake([self.queue_name])
            self._woken = False
        if self.message_cache:
            # Fetched, never handed out: the thread restarts its consumer (after an error) or
            # stops. The queue's next consumer puts them back (at a stop, the drain does).
            self.broker.holdings.lost(self.queue_name)
        super().close()


def end_waits(consumers: Iterable[WakingRedisConsumer]) -> threading.Thread | None:
    """End the waits of ``consumers`` (of one broker), whose worker is stopping (their threads'
    stop flags are set), at once rather than when they run out. Returns at once: the pushes go in
    one pipeline from the returned thread (a frozen Redis must not hold the drain; the waits then
    end by their own timeout)."""
    ending = list(consumers)
    for consumer in ending:
        consumer._ending = True
    if not ending:
        return None

    def push() -> None:
        try:
            with ending[0].broker.client.pipeline(transaction=False) as pipe:
                for consumer in ending:
                    pipe.rpush(consumer._stop_key, "1")
                    pipe.pexpire(consumer._stop_key, _STOP_TTL_MS)
                pipe.execute()
        except redis.RedisError:
            pass

    thread = threading.Thread(target=push, name="end-consumer-waits", daemon=True)
    try:
        thread.start()
    except RuntimeError:
        # No thread to be had (the host's limit: what fails a worker's start part-way, whose
        # clean-up comes here): pushed from this thread, bounded by the client's socket timeout.
        push()
        return None
    return thread
