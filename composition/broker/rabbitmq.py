"""Dramatiq's RabbitMQ broker with consumers that stop a paused queue's deliveries.

Not Dramatiq's consumer pause, which closes its connection: RabbitMQ then redelivers every
unacknowledged message of it, running ones included (they would run twice). A
``PausableRabbitmqConsumer`` of a paused work queue cancels its subscription instead
(``basic.cancel``), keeps its connection and unacknowledged messages, and subscribes again on
resume. Delay queues are never paused: a due message moves on to its paused queue and waits
there. The queues are declared as ``composition.broker.rabbitmq_queues`` says: classic or quorum.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any

import pika.exceptions
from dramatiq.broker import MessageProxy
from dramatiq.brokers.rabbitmq import RabbitmqBroker, _RabbitmqConsumer
from dramatiq.common import dq_name, q_name, xq_name
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message

from composition.broker.hooks import DefinedHooks
from composition.broker.pausing import HAND_BACK_OPTION, LOCAL_OPTIONS, handed_back, paused_queues
from composition.broker.priorities import rabbitmq_priority
from composition.broker.rabbitmq_queues import (
    dead_queue_arguments,
    declare,
    delay_queue_arguments,
    work_queue_arguments,
)
from composition.broker.stand_ins import StandIns

__all__ = ["PAUSED_WAIT_S", "PausableRabbitmqBroker", "PausableRabbitmqConsumer"]

# While paused, the consumer thread serves its connection (acknowledgements the worker threads
# post, heartbeats) in slices this long, and sees a resume or a stop within one.
PAUSED_WAIT_S = 0.2

_PIKA_FAILURES = (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError)


# Relies on Dramatiq internals (dramatiq>=2.2,<3): _RabbitmqConsumer's connection, channel,
# iterator and known_tags; docs/architecture.md lists them.
# Paused, pika hands back what it had received and not yet given out; running jobs are
# acknowledged as usual, and a message marked hand_back() is basic_nack-ed with requeue=True,
# which keeps it on the queue with its delivery count. On a quorum queue, whose x-delivery-limit
# counts those returns, it goes back as a copy (same message id) published before the original is
# acknowledged, so pauses never use the limit up (a copy it cannot publish is nacked as above).
class PausableRabbitmqConsumer(_RabbitmqConsumer):
    """Dramatiq's RabbitMQ consumer that unsubscribes while its queue is paused (module doc)."""

    def __init__(self, broker: RabbitmqBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)
        self._inactivity_timeout_s = timeout / 1000
        self._pausable = q_name(queue_name) == queue_name
        self._subscribed = True

    def __next__(self) -> MessageProxy | None:
        if self._pausable:
            if self.queue_name in paused_queues:
                self._wait_paused()
                return None
            if not self._subscribed:
                self._subscribe()
        return super().__next__()

    def _wait_paused(self) -> None:
        try:
            if self._subscribed:
                self._subscribed = False
                self.channel.cancel()
            # Not time.sleep: this serves the connection, so the acknowledgements of running
            # jobs and the hand-backs of prefetched ones go out meanwhile.
            self.connection.sleep(PAUSED_WAIT_S)
        except _PIKA_FAILURES as exc:
            raise ConnectionClosed(exc) from None

    def _subscribe(self) -> None:
        try:
            self.iterator = self.channel.consume(self.queue_name, inactivity_timeout=self._inactivity_timeout_s)
        except _PIKA_FAILURES as exc:
            raise ConnectionClosed(exc) from None
        self._subscribed = True

    def ack(self, message: MessageProxy) -> None:
        if not handed_back(message):
            super().ack(message)
            return
        if self.broker.queue_type == "quorum" and self._publish_copy(message):
            # Published: from here on it is acknowledged like any message (a retried ack after a
            # lost connection must not publish a second copy).
            message.options.pop(HAND_BACK_OPTION, None)
            super().ack(message)
            return
        try:
            self.known_tags.remove(message._tag)
            self.connection.add_callback_threadsafe(partial(self.channel.basic_nack, message._tag, requeue=True))
        except _PIKA_FAILURES as exc:
            raise ConnectionClosed(exc) from None
        except KeyError:
            # Not delivered on this connection (it was replaced since): RabbitMQ redelivered it already.
            pass


    def _publish_copy(self, message: MessageProxy) -> bool:
        """Publish ``message`` again on its queue, as fetched, on the calling (worker) thread's
        confirmed connection; False when RabbitMQ did not take it, or when this consumer's
        connection is gone: RabbitMQ gives the original back then, and a copy would be a second.
        A connection lost between the copy and the ack also gives the original back: at least
        once, as any redelivery."""
        if message._tag not in self.known_tags or not self.connection.is_open:
            return False
        options = {name: value for name, value in message.options.items() if name not in LOCAL_OPTIONS}
        copy: Message[Any] = Message(**{**message.asdict(), "options": options})
        try:
            self.broker.enqueue(copy)
        except (ConnectionClosed, *_PIKA_FAILURES) as exc:
            self.logger.warning("could not hand back a copy of message %s; nacked instead: %s", message.message_id, exc)
            return False
        return True


class PausableRabbitmqBroker(DefinedHooks, StandIns, RabbitmqBroker):
    """Dramatiq's ``RabbitmqBroker`` whose consumers are ``PausableRabbitmqConsumer``, whose
    queues are classic or quorum (``queue_type``; ``delivery_limit`` on quorum work queues), and
    whose messages carry their priority to queues declared with ``x-max-priority``."""

    def __init__(self, *, queue_type: str = "classic", delivery_limit: int = 20, **options: Any) -> None:
        super().__init__(**options)
        self.queue_type = queue_type
        self.delivery_limit = delivery_limit

    def ensure_queues(self, queue_names: Iterable[str]) -> None:
        """Declare ``queue_names`` (with their delay and dead queues) on RabbitMQ now, on this
        thread's connection, closed after: a queue RabbitMQ refuses (``QueueArgumentsConflict``)
        fails the caller, a worker's start, instead of Dramatiq's consumer threads, which would
        retry it every 3 s for ever."""
        try:
            for name in queue_names:
                self.declare_queue(name, ensure=True)
        finally:
            del self.connection

    # Dramatiq's own declarations hard-code classic queues' arguments (dramatiq>=2.2,<3 internals;
    # docs/architecture.md lists them).
    def _declare_queue(self, queue_name: str) -> Any:
        return declare(self, queue_name, work_queue_arguments(
            queue_name, queue_type=self.queue_type, max_priority=self.max_priority, delivery_limit=self.delivery_limit))

    def _declare_dq_queue(self, queue_name: str) -> Any:
        return declare(self, dq_name(queue_name), delay_queue_arguments(
            queue_name, queue_type=self.queue_type, max_priority=self.max_priority))

    def _declare_xq_queue(self, queue_name: str) -> Any:
        return declare(self, xq_name(queue_name), dead_queue_arguments(queue_type=self.queue_type))

    @property
    def consumer_class(self) -> Any:
        return PausableRabbitmqConsumer

    def enqueue(self, message: Any, *, delay: int | None = None) -> Any:
        # Dramatiq sends options["broker_priority"] as the AMQP priority; one a caller set wins.
        priority = rabbitmq_priority(message.options, self.max_priority)
        if priority is not None and "broker_priority" not in message.options:
            message = message.copy(options={"broker_priority": priority})
        return super().enqueue(message, delay=delay)
