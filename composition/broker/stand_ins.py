"""``StandIns``: a broker that can answer a job name no actor declares with a stand-in.

Dramatiq's consumer thread rejects a message whose actor it cannot find before any worker thread
or middleware sees it; on RabbitMQ that nack is dead-lettered into the broker's queue at once.
During a rolling deploy such a message is only early (its job exists in the code still rolling
out) or late (its job was removed), and deciding which, and for how long to wait, is the jobs'
business: a worker sets ``stand_in`` (``composition.jobs.deploy_window``) and the message then
reaches a worker thread like any other. Every other caller (``publish()``, the checks) reads
``broker.actors``, which stand-ins never enter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dramatiq.broker import Broker
from dramatiq.errors import ActorNotFound

__all__ = ["StandIns"]


class StandIns(Broker):
    """Mixed in before a Dramatiq broker class (see module doc)."""

    # Builds the stand-in for (broker, actor name); None: unknown names raise ActorNotFound.
    stand_in: Callable[[Broker, str], Any] | None = None

    def get_actor(self, actor_name: str) -> Any:
        actor = self.actors.get(actor_name)
        if actor is not None:
            return actor
        if self.stand_in is None:
            raise ActorNotFound(actor_name)
        return self.stand_in(self, actor_name)
