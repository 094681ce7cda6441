"""``Expiry`` drops, unrun, a message whose expiry (``publish(..., expires_s=)``: its
``EXPIRES_AT_HEADER``) has passed when a worker takes it: acknowledged, counted as ``expired``,
logged, neither retried nor dead-lettered, since its publisher said it is worth nothing late. A
retry that comes due after the expiry is dropped the same way; a replayed dead letter has none."""

from __future__ import annotations

import time
from typing import Any

import structlog
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware, SkipMessage

from composition.jobs.current import attempt_of
from composition.metrics import JOBS_TOTAL
from composition.outbox.publish import EXPIRES_AT_HEADER

__all__ = ["EXPIRED_OPTION", "Expiry", "expired", "expires_at"]

log = structlog.get_logger("composition.jobs")

# Set on a message this middleware dropped, for the after-hooks (RunSignals' outcome, the quiet
# skip log).
EXPIRED_OPTION = "composition_expired"


def expires_at(message: MessageProxy) -> float | None:
    """The Unix time after which ``message`` is not to start, or None."""
    headers = message.options.get("composition")
    value: Any = headers.get(EXPIRES_AT_HEADER) if isinstance(headers, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def expired(message: Any) -> bool:
    """Whether ``Expiry`` dropped ``message``."""
    return message.options.get(EXPIRED_OPTION) is True


class Expiry(Middleware):
    """Drop a message past its expiry (see module doc); right after ``PausedQueues``, so it takes
    no limit slot and runs no other before-hook."""

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        deadline = expires_at(message)
        if deadline is None:
            return
        late_s = time.time() - deadline
        if late_s < 0:
            return
        message.options[EXPIRED_OPTION] = True
        JOBS_TOTAL.labels(message.actor_name, "expired").inc()
        # Bound here: MessageContext, which binds the job's log context, comes later in the stack.
        log.warning("job expired unrun", job_id=message.message_id, actor=message.actor_name,
                    attempt=attempt_of(message), expired_s_ago=round(late_s, 3))
        raise SkipMessage
