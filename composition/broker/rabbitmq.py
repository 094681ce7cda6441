"""Dramatiq's RabbitMQ broker with consumers that stop a paused queue's deliveries.

Not Dramatiq's consumer pause: a paused Dramatiq consumer closes its connection, and RabbitMQ
then redelivers every unacknowledged message of it, the ones still running on this host
included (they would run twice). A ``PausableRabbitmqConsumer`` of a paused work queue cancels
its subscription instead (``basic.cancel``; pika hands back what it had received and not yet
given out): the connection, the channel and their unacknowledged messages stay, running jobs
are acknowledged as usual, and a message marked ``hand_back()`` is ``basic_nack``-ed with
``requeue=True``, which keeps it on the queue with its delivery count. On resume it subscribes
again. Delay queues are never paused: a due message moves on to its paused queue and waits
there.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pika.exceptions
from dramatiq.broker import MessageProxy
from dramatiq.brokers.rabbitmq import RabbitmqBroker, _RabbitmqConsumer
from dramatiq.common import q_name
from dramatiq.errors import ConnectionClosed

from composition.broker.pausing import handed_back, paused_queues
from composition.broker.priorities import rabbitmq_priority
from composition.broker.stand_ins import StandIns

__all__ = ["PAUSED_WAIT_S", "PausableRabbitmqBroker", "PausableRabbitmqConsumer"]

# While paused, the consumer thread serves its connection (acknowledgements the worker threads
# post, heartbeats) in slices this long, and sees a resume or a stop within one.
PAUSED_WAIT_S = 0.2

_PIKA_FAILURES = (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError)


# Relies on Dramatiq internals (dramatiq>=2.2,<3): _RabbitmqConsumer's connection, channel,
# iterator and known_tags; docs/architecture.md lists them.
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
        try:
            self.known_tags.remove(message._tag)
            self.connection.add_callback_threadsafe(partial(self.channel.basic_nack, message._tag, requeue=True))
        except _PIKA_FAILURES as exc:
            raise ConnectionClosed(exc) from None
        except KeyError:
            # Not delivered on this connection (it was replaced since): RabbitMQ redelivered it already.
            pass


class PausableRabbitmqBroker(StandIns, RabbitmqBroker):
    """Dramatiq's ``RabbitmqBroker`` whose consumers are ``PausableRabbitmqConsumer``, and whose
    messages carry their priority to queues declared with ``x-max-priority``."""

    @property
    def consumer_class(self) -> Any:
        return PausableRabbitmqConsumer

    def enqueue(self, message: Any, *, delay: int | None = None) -> Any:
        # Dramatiq sends options["broker_priority"] as the AMQP priority; one a caller set wins.
        priority = rabbitmq_priority(message.options, self.max_priority)
        if priority is not None and "broker_priority" not in message.options:
            message = message.copy(options={"broker_priority": priority})
        return super().enqueue(message, delay=delay)
