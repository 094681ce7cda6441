"""Enqueue a batch of Dramatiq messages on RabbitMQ, returning only once RabbitMQ confirmed all.

``enqueue_confirmed`` publishes each message as ``RabbitmqBroker.enqueue`` does (so workers consume
it unchanged) on a publisher-confirm channel of our own, then waits once for all the confirms. A
nack or a return raises ``MessagesRejected``, no answer ``ConfirmTimeout``, a lost connection
``ConnectionClosed``: the relay never marks sent a row RabbitMQ has not taken. pika connections are
not thread-safe, so each thread has its own channel per broker, on Dramatiq's per-thread connection.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence
from itertools import takewhile
from typing import Any

import pika
import pika.exceptions
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.common import current_millis, dq_name, q_name
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message

from composition.broker.priorities import rabbitmq_priority
from composition.errors import described
from composition.outbox.errors import ConfirmTimeout, MessagesRejected

__all__ = ["ConfirmTimeout", "MessagesRejected", "enqueue_confirmed"]

# A lost connection (most often this thread's, closed by RabbitMQ while it sat idle past its
# heartbeat) gets one more try on a fresh one, as Dramatiq's enqueue retries; what the first try
# published may then arrive twice, which at-least-once delivery (and the inbox ledger) allows.
_MAX_ATTEMPTS = 2
# Messages published before waiting for their confirms: a relay batch (500 by default) is one
# wait; a bigger call waits once per chunk, so the timeout is per chunk, not per call.
_MAX_MESSAGES_PER_CONFIRM = 1000


def enqueue_confirmed(broker: RabbitmqBroker, items: Sequence[tuple[Message[Any], int | None]], *,
                      confirm_timeout_s: float) -> list[Message[Any]]:
    """Enqueue ``(message, delay_ms)`` pairs in order on ``broker``; return the messages as
    enqueued, once RabbitMQ has confirmed every one of them.

    Raises ``MessagesRejected`` when RabbitMQ nacks or returns any of them, ``ConfirmTimeout``
    when a chunk of them is not confirmed within ``confirm_timeout_s`` seconds, and Dramatiq's
    ``ConnectionClosed`` when the connection fails twice; the messages before the failure may
    stay enqueued.
    """
    if not items:
        return []
    prepared = [_prepare(message, delay_ms) for message, delay_ms in items]
    for message, _, delay_ms in prepared:
        broker.emit_before("enqueue", message, delay_ms)
    for start in range(0, len(prepared), _MAX_MESSAGES_PER_CONFIRM):
        _publish_chunk(broker, prepared[start:start + _MAX_MESSAGES_PER_CONFIRM], confirm_timeout_s)
    for message, _, delay_ms in prepared:
        broker.emit_after("enqueue", message, delay_ms)
    return [message for message, _, _ in prepared]


def _prepare(message: Message[Any], delay_ms: int | None) -> tuple[Message[Any], str, int | None]:
    # As in RabbitmqBroker.enqueue: a delayed message goes to the delay queue with its eta.
    routing_key = message.queue_name
    if delay_ms is not None:
        routing_key = dq_name(routing_key)
        message = message.copy(queue_name=routing_key, options={"eta": current_millis() + delay_ms})
    return message, routing_key, delay_ms


def _publish_chunk(broker: RabbitmqBroker, chunk: Sequence[tuple[Message[Any], str, int | None]],
                   confirm_timeout_s: float) -> None:
    deliveries = [
        (routing_key, message.encode(),
         pika.BasicProperties(delivery_mode=2, priority=message.options.get(
             "broker_priority", rabbitmq_priority(message.options, broker.max_priority))))
        for message, routing_key, _ in chunk
    ]
    queues = dict.fromkeys(q_name(routing_key) for routing_key, _, _ in deliveries)
    attempt = 1
    while True:
        try:
            for queue_name in queues:
                # Declares the queue, its delay and dead-letter queues on first use, as enqueue does.
                broker.declare_queue(queue_name, ensure=True)
            _confirm_channel(broker).publish(deliveries, timeout_s=confirm_timeout_s)
            return
        except MessagesRejected as exc:
            if exc.returned:
                # As in RabbitmqBroker.enqueue: a returned message means its queue is gone
                # (deleted by hand, say); declare it again before the next publish to it.
                broker.queues_pending.update(q_name(routing_key) for routing_key in exc.returned)
            raise
        except ConfirmTimeout:
            raise
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as exc:
            # Drop this thread's connection (and the channels on it): the next try, or the next
            # caller on this thread, starts on a fresh one.
            del broker.connection
            if attempt >= _MAX_ATTEMPTS:
                raise ConnectionClosed(described(exc)) from exc
            attempt += 1


# Confirms, not one AMQP transaction per batch: tx_commit was slower (bench/bench_rabbitmq_relay.py)
# and is not atomic: a message a full queue refuses closes the channel at commit, after the others
# went through, without saying which one failed; confirms ack or nack each message.
class _ConfirmChannel:
    """A channel in publisher-confirm mode that publishes a whole batch, then waits once."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self._channel = connection.channel()
        # pika's blocking channel cannot publish in confirm mode without waiting per message: its
        # _impl and _flush_output are pika 1.x internals (docs/architecture.md lists them).
        self._impl = self._channel._impl
        # Delivery tags number the channel's publishes from 1; tags not yet acked or nacked, in
        # publish order (a dict keeps it, so a "multiple" ack settles a prefix).
        self._next_tag = 1
        self._unconfirmed: dict[int, None] = {}
        self._nacked = 0
        self._returned: list[str] = []
        selected: list[bool] = []
        self._impl.confirm_delivery(ack_nack_callback=self._on_confirm, callback=lambda _frame: selected.append(True))
        self._impl.add_on_return_callback(self._on_return)
        self._channel._flush_output(lambda: bool(selected))

    @property
    def is_open(self) -> bool:
        return bool(self._channel.is_open and self.connection.is_open)

    def publish(self, deliveries: Sequence[tuple[str, bytes, Any]], *, timeout_s: float) -> None:
        """Publish ``(routing_key, body, properties)`` in order, then wait until RabbitMQ has
        confirmed them all; raise ``MessagesRejected`` or ``ConfirmTimeout`` as
        ``enqueue_confirmed`` documents.

        The wait is bounded once the batch is written; a connection that RabbitMQ blocks (a
        resource alarm) stops the writes themselves, which only pika's
        ``blocked_connection_timeout`` bounds, as for Dramatiq's own publishes.
        """
        # Tags of an earlier batch that timed out are forgotten: a late confirm for one of them
        # settles nothing now (a "multiple" ack only settles tags up to its own).
        self._unconfirmed = {}
        self._nacked = 0
        self._returned = []
        for routing_key, body, properties in deliveries:
            self._impl.basic_publish(exchange="", routing_key=routing_key, body=body, properties=properties,
                                     mandatory=True)
            self._unconfirmed[self._next_tag] = None
            self._next_tag += 1
        deadline = time.monotonic() + timeout_s
        # A timer, so the I/O loop wakes at the deadline even when RabbitMQ sends nothing.
        timer = self.connection.call_later(timeout_s, _wake)
        try:
            self._channel._flush_output(lambda: not self._unconfirmed or time.monotonic() >= deadline)
        finally:
            self.connection.remove_timeout(timer)
        if self._unconfirmed:
            raise ConfirmTimeout(total=len(deliveries), unconfirmed=len(self._unconfirmed), timeout_s=timeout_s)
        if self._nacked or self._returned:
            raise MessagesRejected(total=len(deliveries), nacked=self._nacked, returned=self._returned)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        if method.multiple:
            settled = list(takewhile(lambda tag: tag <= method.delivery_tag, self._unconfirmed))
        else:
            settled = [method.delivery_tag] if method.delivery_tag in self._unconfirmed else []
        for tag in settled:
            del self._unconfirmed[tag]
        if isinstance(method, pika.spec.Basic.Nack):
            self._nacked += len(settled)

    def _on_return(self, _channel: Any, method: Any, _properties: Any, _body: bytes) -> None:
        # RabbitMQ sends a message's Basic.Return before its Basic.Ack: the batch waits for the
        # ack and then fails.
        self._returned.append(method.routing_key)


def _wake() -> None:
    """Timer callback that only ends the I/O loop's wait."""


# Per thread, this thread's confirm channel for each broker (weak keys: a channel never keeps a
# closed broker alive, and a thread's entries go with the thread).
_local = threading.local()


def _confirm_channel(broker: RabbitmqBroker) -> _ConfirmChannel:
    channels: weakref.WeakKeyDictionary[RabbitmqBroker, _ConfirmChannel] | None = getattr(_local, "channels", None)
    if channels is None:
        channels = _local.channels = weakref.WeakKeyDictionary()
    connection = broker.connection
    if not connection.is_open:
        # A connection RabbitMQ or broker.close() closed stays in Dramatiq's thread state until
        # an enqueue on this thread fails on it; don't wait for that.
        del broker.connection
        connection = broker.connection
    channel = channels.get(broker)
    if channel is None or channel.connection is not connection or not channel.is_open:
        channel = channels[broker] = _ConfirmChannel(connection)
    return channel
