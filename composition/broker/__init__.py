"""The Dramatiq broker: the configured one, built from settings, never a default
(``configured``); Redis whose idle consumers wake when a message arrives (``redis``,
``redis_consumer``); job time limits, shared by the workers and the relay's batches
(``time_limits``). Invariant: the configured broker is set before any actor is declared.
"""

from composition.broker.configured import JOB_MIDDLEWARE, broker_kind, build_broker, configured_broker, reset_broker

__all__ = ["JOB_MIDDLEWARE", "broker_kind", "build_broker", "configured_broker", "reset_broker"]
