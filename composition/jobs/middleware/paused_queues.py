"""``PausedQueues`` hands back, unstarted, a message of a queue paused after it was fetched.

A consumer prefetches up to twice its threads into the process's work queue, and a worker
thread takes from there whatever queue a message came from; stopping the consumer stops only
the fetching. So the first before-hook asks whether the message's queue is paused now
(``composition.broker.pausing``: a set lookup) and, if so, marks it to go back to its queue and
skips it: nothing else of the stack runs for it, it is not counted as a run, and it keeps its
broker id and attempts."""

from __future__ import annotations

from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware, SkipMessage

from composition.broker.pausing import hand_back, paused_queues

__all__ = ["PausedQueues"]


class PausedQueues(Middleware):
    """Hand back a message whose queue is paused (see module doc); first in the stack."""

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        if message.queue_name in paused_queues:
            hand_back(message)
            raise SkipMessage(f"queue {message.queue_name} is paused: handed back to it, not started")
