"""What a worker does with a message its code cannot run (``IncompatibleMessageError``): its job
unknown here, a version its upgrades do not cover, arguments that do not fit.

During a rolling deploy that is often a matter of minutes, so the message goes back to wait, as
a delayed copy, for ``DEPLOY_WINDOW_S`` counted from the first refusal; then it is parked as a
dead letter in the group "incompatible with the running code" and never retried. Replayed once
the code that runs it is deployed, it runs once (the ledger keeps its first id).
``accept_unknown_jobs`` makes a worker take unknown job names down the same path.
"""

from __future__ import annotations

from typing import Any, NoReturn

import structlog
from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import current_millis
from dramatiq.errors import ActorNotFound
from dramatiq.middleware import SkipMessage

from composition.broker.stand_ins import StandIns
from composition.conf import conf
from composition.errors import IncompatibleMessageError, PermanentError
from composition.jobs.current import current_message
from composition.jobs.middleware.put_backs import put_back_delayed
from composition.metrics import INCOMPATIBLE_MESSAGES_TOTAL

__all__ = ["INCOMPATIBLE_SINCE_OPTION", "MAX_WAIT_S", "StandInActor", "accept_unknown_jobs", "refuse"]

log = structlog.get_logger("composition.jobs")

# When a message was first refused (ms), carried by its put-back copies.
INCOMPATIBLE_SINCE_OPTION = "composition_incompatible_since_ms"
# A refused message comes back at most this long after each refusal (a twentieth of the window,
# at least 1 s), so a finished deploy takes it soon.
MAX_WAIT_S = 30.0


def refuse(broker: Broker, message: MessageProxy, error: IncompatibleMessageError) -> NoReturn:
    """Put ``message`` back to wait and skip it while its deploy window lasts; then raise
    ``error``, which dead-letters it at once (a ``PermanentError``)."""
    window_ms = float(conf.DEPLOY_WINDOW_S) * 1000
    now = current_millis()
    since = message.options.get(INCOMPATIBLE_SINCE_OPTION)
    if isinstance(since, bool) or not isinstance(since, int) or since > now:
        since = now
    left_ms = since + window_ms - now
    if left_ms > 0:
        wait_s = min(MAX_WAIT_S, max(1.0, window_ms / 1000 / 20), left_ms / 1000)
        if put_back_delayed(broker, message, wait_s, {INCOMPATIBLE_SINCE_OPTION: since}):
            INCOMPATIBLE_MESSAGES_TOTAL.labels(message.actor_name, "waiting").inc()
        # A warning at its first refusal only: a deploy that strands thousands of messages must
        # not write a warning per message every few seconds for the whole window.
        (log.warning if since == now else log.debug)(
            "the running code cannot run this message; it waits for the deploy", reason=error.reason,
            waited_s=round((now - since) / 1000, 1), window_left_s=round(left_ms / 1000, 1))
        raise SkipMessage(f"incompatible with the running code, waiting for the deploy: {error.reason}")
    INCOMPATIBLE_MESSAGES_TOTAL.labels(message.actor_name, "parked").inc()
    raise error


class StandInActor:
    """What a worker's broker answers for a job name no actor declares: run, it refuses its
    message (``refuse``), so the message waits for the deploy, then is parked."""

    priority = 0

    def __init__(self, broker: Broker, actor_name: str) -> None:
        self.broker = broker
        self.actor_name = actor_name
        self.queue_name: str | None = None
        # Read by the retry middleware: what it raises is never retried.
        self.options: dict[str, Any] = {"throws": (PermanentError,), "max_retries": 0}

    def send(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ActorNotFound(self.actor_name)  # Dramatiq's callbacks send to a named actor

    send_with_options = send

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        # Celery's "did you remember to import the module?": a job declared outside an app's
        # jobs.py is known where its module was imported (the web) and nowhere else.
        error = IncompatibleMessageError(f"no job named {self.actor_name!r} here (removed, renamed without "
                                         "an alias, not yet deployed on this worker, or declared in a module "
                                         "the worker does not import: declare jobs in an app's jobs.py)")
        message = current_message()
        if message is None:
            raise error
        refuse(self.broker, message, error)


def accept_unknown_jobs(broker: Broker, accept: bool = True) -> None:
    """Have ``broker`` answer unknown job names with a ``StandInActor``
    (``composition.broker.stand_ins``), so those messages wait out the deploy window instead of
    being rejected by Dramatiq's consumer (on RabbitMQ, into the broker's dead-letter queue); with
    ``accept=False`` no longer. A broker that cannot (not a ``StandIns``) keeps rejecting them
    (``UnknownActors``)."""
    if isinstance(broker, StandIns):
        broker.stand_in = StandInActor if accept else None
