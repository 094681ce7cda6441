"""``LimitedStarts``: a job declared with ``concurrency=`` or ``rate=`` starts only within its
limits, counted across the cluster on the cache's Redis (``composition.limits``).

A start the limits allow takes its slot (released after the run, however it ends; a run put back
to wait, for a deploy, also hands its rate start back); a start they
refuse is put back as a delayed copy of the message, and skipped: it waits in the delay queue,
not in a worker thread, and is neither a failure nor a retry. While the limits' Redis cannot be
reached, a limited job waits rather than run unlimited.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

import structlog
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware, SkipMessage

from composition.errors import REDIS_ERRORS, described
from composition.jobs.middleware.put_backs import put_back, put_back_delayed
from composition.limits.declared import JobLimits
from composition.limits.leases import held_slots
from composition.limits.store import Admission, limit_store
from composition.metrics import JOB_LIMIT_DELAYS_TOTAL

__all__ = ["LIMIT_STARTED_AT_OPTION", "LIMIT_WAITS_OPTION", "UNREACHABLE_DELAY_S", "LimitedStarts"]

log = structlog.get_logger("composition.jobs")

# How many times a message was put back by a limit (carried in the copy, for its logs).
LIMIT_WAITS_OPTION = "composition_limit_waits"
# When the limits let this run start, in seconds on the Redis server's clock (the clock its rate
# is counted on); each run's admission sets it.
LIMIT_STARTED_AT_OPTION = "composition_limit_started_at"
# While the limits' Redis cannot be asked, a limited start waits this long and asks again.
UNREACHABLE_DELAY_S = 5.0


# Second in the stack, before anything counts the message as a run. A slot is renewed during the
# run by composition.limits.leases.SlotRenewer. A refused start's copy is the message as fetched
# (same id, same attempts, composition_limit_waits + 1), enqueued before the original is
# acknowledged; when the copy cannot be enqueued, the message goes back to its queue by its
# broker id instead (hand_back).
class LimitedStarts(Middleware):
    """Starts a limited job only within its limits (see the module doc)."""

    def __init__(self) -> None:
        # What this worker thread's current run took: (message, job name, token, whether it
        # holds a concurrency slot).
        self._slot = threading.local()

    @property
    def actor_options(self) -> set[str]:
        return {"job_limits"}

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        actor = broker.actors.get(message.actor_name)
        limits: JobLimits | None = None if actor is None else actor.options.get("job_limits")
        if actor is None or limits is None:
            return
        token = secrets.token_hex(12)
        try:
            # Under the job's own name: a message sent under an alias shares its limit.
            admission = limit_store().admit(actor.actor_name, limits, token)
        except REDIS_ERRORS as exc:
            log.warning("job limits unreachable; the job waits rather than run unlimited",
                        actor=message.actor_name, error=described(exc))
            admission = Admission(False, UNREACHABLE_DELAY_S, "unreachable")
        if admission.started:
            message.options[LIMIT_STARTED_AT_OPTION] = admission.at_s
            has_slot = limits.concurrency is not None
            if has_slot:
                held_slots.add(actor.actor_name, token)
            self._slot.held = (message, actor.actor_name, token, has_slot)
            return
        self._put_back(broker, message, actor.actor_name, admission)
        raise SkipMessage(f"{message.actor_name} is at its {admission.kind} limit: back in {admission.delay_s:.2f} s")

    def _put_back(self, broker: Broker, message: MessageProxy, job: str, admission: Admission) -> None:
        waits = int(message.options.get(LIMIT_WAITS_OPTION, 0)) + 1
        if put_back_delayed(broker, message, admission.delay_s, {LIMIT_WAITS_OPTION: waits}):
            JOB_LIMIT_DELAYS_TOTAL.labels(job, admission.kind).inc()
            log.debug("job at its limit, put back", actor=job, limit=admission.kind,
                      delay_s=admission.delay_s, waits=waits)

    def _release(self, message: MessageProxy, *, refund: bool = False) -> None:
        held: tuple[MessageProxy, str, str, bool] | None = getattr(self._slot, "held", None)
        if held is None or held[0] is not message:
            return
        self._slot.held = None
        _, actor, token, has_slot = held
        if not has_slot and not refund:
            return  # a rate's start stays counted: nothing to free
        # Forgotten before it is freed: a renewal that finds it freed then knows the run ended.
        held_slots.discard(actor, token)
        try:
            limit_store().release(actor, token, refund=refund)
        except REDIS_ERRORS as exc:  # the lease expires on its own, the start with its window
            log.warning("could not free a concurrency slot; it frees itself at its TTL", actor=actor,
                        error=described(exc))

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        self._release(message)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        # A started run put back to wait (for a deploy: composition.jobs.deploy_window) ran none
        # of its body: during a rolling deploy, messages the code cannot run yet would otherwise
        # spend the job's rate every few seconds. A job that skips itself did run.
        self._release(message, refund=put_back(message))


