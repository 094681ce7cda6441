"""Load shedding: ``admit(queue)`` raises ``Backpressure`` when a queue's backlog is at its
limit or the queue is shed under pressure, and ``BackpressureMiddleware`` answers such a request
503 with Retry-After (``admission``); the backlog is ``depth``'s, the shed queues ``shed``'s.
Invariant: work is refused before a queue overflows, and reads are never shed.
"""

from composition.backpressure.admission import Backpressure, BackpressureMiddleware, admit
from composition.backpressure.depth import BrokerCounts, QueueDepths, broker_counts, queue_depth

__all__ = ["Backpressure", "BackpressureMiddleware", "BrokerCounts", "QueueDepths", "admit", "broker_counts",
           "queue_depth"]
