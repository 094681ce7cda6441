"""Putting a fetched message back to wait, as a delayed copy, when it must not run yet (its job
at a limit, its code not yet deployed here): neither a failure nor a retry.

The copy is the message as fetched (same id, same attempts) with ``carry`` added to its options,
enqueued with a delay before the original is acknowledged; the caller then skips the original.
When the copy cannot be enqueued, the message goes back to its queue by its broker id instead
(``hand_back``), to come again at once.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import structlog
from dramatiq.broker import Broker, MessageProxy
from dramatiq.message import Message

from composition.broker.pausing import PUT_BACK_OPTION, hand_back
from composition.errors import BROKER_FAILURES, described
from composition.jobs.middleware.retries import options_as_fetched

__all__ = ["JITTER_SHARE", "put_back", "put_back_delayed"]

log = structlog.get_logger("composition.jobs")

# Each delay is stretched by up to this share, so the waiting ones of one moment spread out.
JITTER_SHARE = 0.1


def put_back_delayed(broker: Broker, message: MessageProxy, delay_s: float, carry: Mapping[str, Any]) -> bool:
    """Enqueue the delayed copy (see module doc); True when it was, False when the message was
    handed back to its queue instead."""
    copy: Message[Any] = Message(**{**message.asdict(), "options": {**options_as_fetched(message), **carry}})
    delay_ms = max(1, round(delay_s * 1000 * (1 + random.uniform(0, JITTER_SHARE))))
    message.options[PUT_BACK_OPTION] = True
    try:
        broker.enqueue(copy, delay=delay_ms)
    except BROKER_FAILURES as exc:
        hand_back(message)
        log.warning("could not put a job back delayed; back to its queue instead", actor=message.actor_name,
                    error=described(exc))
        return False
    return True


def put_back(message: Any) -> bool:
    """True for a skipped message that went back to wait (a limit, a deploy), not dropped."""
    return bool(message.options.get(PUT_BACK_OPTION))
