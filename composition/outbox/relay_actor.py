"""The relay actor: a nudge message that makes a worker run the relay for a bounded round.

``publish()`` sends a nudge after its transaction commits; a worker that receives it runs the
relay until the outbox is idle or the round's budget is spent, and then hands the rest on with a
fresh nudge. The sweeper in ``runworkers`` covers nudges that were lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import dramatiq
import structlog
from django.db import close_old_connections
from dramatiq.actor import Actor
from dramatiq.broker import Broker

from composition.conf import conf
from composition.errors import described

__all__ = ["DEAD_LETTER_OPTION", "NUDGE_MAX_AGE_S", "RELAY_ACTOR_NAME", "RELAY_QUEUE_NAME", "declare_relay_actor"]

# The relay's logger: these lines were always the relay's.
log = structlog.get_logger("composition.outbox.relay")

RELAY_ACTOR_NAME = "composition_outbox_relay"
# Its own queue, so a nudge never waits behind slow business jobs.
RELAY_QUEUE_NAME = "composition.outbox"
# A nudge older than this is dropped unrun: the sweep has long relayed whatever it was about.
NUDGE_MAX_AGE_S = 60.0
# The actor option (composition.jobs.middleware.dead_letters.DEAD_LETTER_OPTION) that turns dead letters off;
# spelled here so the outbox does not import the jobs package.
DEAD_LETTER_OPTION = "dead_letter"

_declare_lock = threading.Lock()


def declare_relay_actor(broker: Broker, run_round: Callable[[float], bool]) -> Actor[[], None]:
    """The relay actor declared on ``broker`` (declared on the first call, then reused).

    A message to it runs ``run_round(budget_s)`` (``OUTBOX_RELAY_BUDGET_S``), which relays and
    returns True when it left the outbox idle; when it did not, the actor sends itself again.
    ``composition.outbox.relay.relay_actor`` passes this process's relay for ``broker``.
    """
    with _declare_lock:
        # The registry, not get_actor(): a worker's broker answers unknown names with a stand-in.
        declared: Actor[[], None] | None = broker.actors.get(RELAY_ACTOR_NAME)
        if declared is not None:
            return declared

        def composition_outbox_relay() -> None:
            # Dramatiq threads never see request_finished: manage the connection per message.
            close_old_connections()
            try:
                finished = run_round(float(conf.OUTBOX_RELAY_BUDGET_S))
            finally:
                close_old_connections()
            if not finished:
                # Give this worker thread back and let the next free one carry on; should the
                # send fail, the sweeper carries on within a sweep interval.
                try:
                    actor.send()
                except Exception as exc:
                    log.warning("could not hand the rest of the outbox on; the sweep will relay it",
                                error=described(exc))

        options: dict[str, Any] = {}
        if any(DEAD_LETTER_OPTION in middleware.actor_options for middleware in broker.middleware):
            # A failed nudge (a database blip) is not work an operator should see or replay: the
            # rows it was about stay pending and the next nudge or sweep relays them.
            options[DEAD_LETTER_OPTION] = False
        declare = dramatiq.actor(
            actor_name=RELAY_ACTOR_NAME, queue_name=RELAY_QUEUE_NAME, broker=broker, max_retries=0,
            max_age=int(NUDGE_MAX_AGE_S * 1000), time_limit=int(float(conf.OUTBOX_RELAY_TIME_LIMIT_S) * 1000),
            **options,
        )
        actor: Actor[[], None] = declare(composition_outbox_relay)
        return actor
