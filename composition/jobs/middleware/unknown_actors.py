"""Messages for an actor this worker does not know (a deploy removed or renamed the job).

Dramatiq's consumer thread rejects such a message before any worker thread sees it, without
running the message hooks, so ``UnknownActors.before_nack`` is the one place to dead-letter it.
The nack is already under way there: only the Redis broker's requeue can still turn it into a
no-op, so elsewhere a dead letter that cannot be written is left to the broker's dead-letter
queue. Messages of known actors were handled after processing (``DeadLetters``).
"""

from __future__ import annotations

import structlog
from django.db import close_old_connections, connections
from dramatiq.broker import Broker, MessageProxy
from dramatiq.errors import ActorNotFound
from dramatiq.middleware import Middleware

from composition.jobs.current import attempt_of
from composition.jobs.middleware.dead_letters import requeue_rejected, requeue_voids_nack, write_dead_letter
from composition.metrics import JOBS_TOTAL

__all__ = ["UnknownActors"]


class UnknownActors(Middleware):
    """Dead-letters a rejected message whose actor is not declared here (see module doc)."""

    def before_nack(self, broker: Broker, message: MessageProxy) -> None:
        try:
            broker.get_actor(message.actor_name)
            return
        except ActorNotFound:
            pass
        error = ActorNotFound(f"no actor named {message.actor_name!r} is declared in this worker "
                              "(removed or renamed by a deploy?)")
        structlog.contextvars.bind_contextvars(job_id=message.message_id, actor=message.actor_name)
        JOBS_TOTAL.labels(message.actor_name, "dead").inc()
        close_old_connections()
        try:
            write_dead_letter(broker, message, error, attempt_of(message),
                              requeue=requeue_rejected if requeue_voids_nack(broker, message) else None)
        finally:
            structlog.contextvars.clear_contextvars()
            close_old_connections()
            # A consumer thread is no worker thread: it does not keep a database connection.
            connections.close_all()
