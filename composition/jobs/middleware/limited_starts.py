"""``LimitedStarts``: a job declared with ``concurrency=`` or ``rate=`` starts only within its
limits, counted across the cluster on the cache's Redis (``composition.limits``).

Second in the stack, before anything counts the message as a run: a start the limits allow
takes its slot (released after the run, however it ends; renewed meanwhile by
``composition.limits.leases.SlotRenewer``); a start they refuse is put back as a delayed copy of
the message as fetched (same id, same attempts, ``composition_limit_waits`` + 1) enqueued
before the original is acknowledged, and skipped. It waits in the queue's delay queue, not in
a worker thread, and is neither a failure nor a retry. When the copy cannot be enqueued, the
message goes back to its queue by its broker id instead (``hand_back``). While the limits'
Redis cannot be reached, a limited job waits rather than run unlimited.
"""

from __future__ import annotations

import random
import secrets
import threading
from typing import Any

import structlog
from dramatiq.broker import Broker, MessageProxy
from dramatiq.message import Message
from dramatiq.middleware import Middleware, SkipMessage

from composition.broker.pausing import hand_back
from composition.errors import BROKER_FAILURES, REDIS_ERRORS, described
from composition.jobs.middleware.retries import options_as_fetched
from composition.limits.declared import JobLimits
from composition.limits.leases import held_slots
from composition.limits.store import Admission, limit_store
from composition.metrics import JOB_LIMIT_DELAYS_TOTAL

__all__ = ["LIMIT_WAITS_OPTION", "PUT_BACK_OPTION", "UNREACHABLE_DELAY_S", "LimitedStarts", "put_back"]

log = structlog.get_logger("composition.jobs")

# How many times a message was put back by a limit (carried in the copy, for its logs).
LIMIT_WAITS_OPTION = "composition_limit_waits"
# Marks, in this process only, a skipped message that was put back rather than dropped.
PUT_BACK_OPTION = "composition_put_back"
# While the limits' Redis cannot be asked, a limited start waits this long and asks again.
UNREACHABLE_DELAY_S = 5.0
# Each delay is stretched by up to this share, so the waiting ones of one moment spread out.
JITTER_SHARE = 0.1


class LimitedStarts(Middleware):
    """Starts a limited job only within its limits (see the module doc)."""

    def __init__(self) -> None:
        # The slot this worker thread's current run holds: (message, job name, token).
        self._slot = threading.local()

    @property
    def actor_options(self) -> set[str]:
        return {"job_limits"}

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        actor = broker.actors.get(message.actor_name)
        limits: JobLimits | None = actor.options.get("job_limits") if actor is not None else None
        if limits is None:
            return
        token = secrets.token_hex(12)
        try:
            admission = limit_store().admit(message.actor_name, limits, token)
        except REDIS_ERRORS as exc:
            log.warning("job limits unreachable; the job waits rather than run unlimited",
                        actor=message.actor_name, error=described(exc))
            admission = Admission(False, UNREACHABLE_DELAY_S, "unreachable")
        if admission.started:
            if limits.concurrency is not None:
                held_slots.add(message.actor_name, token)
                self._slot.held = (message, message.actor_name, token)
            return
        self._put_back(broker, message, admission)
        raise SkipMessage(f"{message.actor_name} is at its {admission.kind} limit: back in {admission.delay_s:.2f} s")

    def _put_back(self, broker: Broker, message: MessageProxy, admission: Admission) -> None:
        waits = int(message.options.get(LIMIT_WAITS_OPTION, 0)) + 1
        copy: Message[Any] = Message(**{**message.asdict(),
                                        "options": {**options_as_fetched(message), LIMIT_WAITS_OPTION: waits}})
        delay_ms = max(1, round(admission.delay_s * 1000 * (1 + random.uniform(0, JITTER_SHARE))))
        message.options[PUT_BACK_OPTION] = True
        try:
            broker.enqueue(copy, delay=delay_ms)
        except BROKER_FAILURES as exc:
            hand_back(message)
            log.warning("could not put a limited job back delayed; back to its queue instead",
                        actor=message.actor_name, error=described(exc))
            return
        JOB_LIMIT_DELAYS_TOTAL.labels(message.actor_name, admission.kind).inc()
        log.debug("job at its limit, put back", actor=message.actor_name, limit=admission.kind,
                  delay_ms=delay_ms, waits=waits)

    def _release(self, message: MessageProxy) -> None:
        held: tuple[MessageProxy, str, str] | None = getattr(self._slot, "held", None)
        if held is None or held[0] is not message:
            return
        self._slot.held = None
        _, actor, token = held
        held_slots.discard(actor, token)
        try:
            limit_store().release(actor, token)
        except REDIS_ERRORS as exc:  # the lease expires on its own
            log.warning("could not free a concurrency slot; it frees itself at its TTL", actor=actor,
                        error=described(exc))

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        self._release(message)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self._release(message)


def put_back(message: Any) -> bool:
    """True for a skipped message that went back to wait (a limit or a pause), not dropped."""
    return bool(message.options.get(PUT_BACK_OPTION))
