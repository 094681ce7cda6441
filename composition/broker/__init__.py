"""The Dramatiq broker: the configured one, built from settings, never a default
(``configured``); Redis whose idle consumers wake when a message arrives (``redis``,
``redis_consumer``) and whose workers put back what a lost connection left with no consumer
(``redis_holdings``); RabbitMQ whose consumers unsubscribe from a paused queue (``rabbitmq``),
its queues classic or quorum (``rabbitmq_queues``); the
process's paused queues and handing a message back (``pausing``); message priorities on both
brokers (``priorities``); a worker's stand-in for a job name no actor declares (``stand_ins``);
job time limits, shared by the workers and the relay's batches (``time_limits``); middleware hooks
called only where a middleware has one (``hooks``). Invariant: the
configured broker is set before any actor is declared.
"""

from composition.broker.configured import JOB_MIDDLEWARE, broker_kind, build_broker, configured_broker, reset_broker
from composition.broker.pausing import hand_back, paused_queues
from composition.broker.rabbitmq_queues import QueueArgumentsConflict

__all__ = ["JOB_MIDDLEWARE", "QueueArgumentsConflict", "broker_kind", "build_broker", "configured_broker",
           "hand_back", "paused_queues", "reset_broker"]
