"""``composition.components``: the stock components under their first import path.

They live in ``composition.lifecycle.components``, ``.worker_threads`` and ``.heartbeat``.
"""

from composition.lifecycle.components import (
    BrokerComponent,
    CacheComponent,
    DatabaseComponent,
    LoggingComponent,
    MetricsComponent,
)
from composition.lifecycle.heartbeat import HeartbeatComponent
from composition.lifecycle.worker_threads import WorkerComponent

__all__ = [
    "BrokerComponent",
    "CacheComponent",
    "DatabaseComponent",
    "HeartbeatComponent",
    "LoggingComponent",
    "MetricsComponent",
    "WorkerComponent",
]
