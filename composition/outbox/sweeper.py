"""The relay sweeper: a ``runworkers`` component that runs the relay every few seconds.

The after-commit nudge gives low latency; the sweep gives the guarantee: a process that dies
between its commit and its nudge, a nudge lost with a broker blip, or a relay that crashed
holding leases all end with the rows relayed at the next sweep (after the lease, for leased
rows). Each sweep first releases held rows that came due (``composition.outbox.held``) and
then samples the outbox gauges.
"""

from __future__ import annotations

import structlog
from django.db import close_old_connections
from dramatiq.broker import Broker

from composition.errors import described
from composition.lifecycle.periodic import PeriodicComponent
from composition.outbox.held import release_due
from composition.outbox.maintenance import refresh_gauges
from composition.outbox.relay import RelayRound, relay_actor, relay_for

__all__ = ["RelaySweeperComponent"]

log = structlog.get_logger("composition.outbox.sweeper")

# A sweep that keeps finding work ends after this long (and the next starts at once), so that
# stopping is prompt and the gauges are sampled.
SWEEP_BUDGET_S = 5.0


class RelaySweeperComponent(PeriodicComponent):
    """Sweeps the outbox at start and then every ``interval_s`` (default
    ``OUTBOX_SWEEP_INTERVAL_S``); a sweep that ran out of time is followed by the next at once.

    Constructing it declares the relay actor on ``broker``, so the worker component (whose
    Dramatiq worker is created at start) also consumes the relay's nudges.
    """

    name = "outbox-relay"
    depends_on = ("database", "broker")
    thread_name = "outbox-sweeper"
    interval_setting = "OUTBOX_SWEEP_INTERVAL_S"
    failure_event = "outbox sweep failed"
    logger = log

    def __init__(self, broker: Broker, *, interval_s: float | None = None) -> None:
        super().__init__(interval_s=interval_s)
        self.broker = broker
        relay_actor(broker)
        self.relay = relay_for(broker)

    def sweep(self) -> RelayRound:
        """One sweep: release held rows that came due, relay what is pending for a bounded time,
        then sample the gauges."""
        close_old_connections()
        try:
            release_due()
            round_ = self.relay.run_coalesced_round(max_s=SWEEP_BUDGET_S)
        except Exception:
            # Also when the round failed (the broker down): then above all, as the backlog grows.
            # Its own failure (the database down too) is logged here; the round's is raised.
            try:
                refresh_gauges()
            except Exception as exc:
                log.warning("outbox gauges not sampled", error=described(exc))
            raise
        refresh_gauges()
        return round_

    def tick(self) -> bool:
        round_ = self.sweep()
        if round_.relayed:
            log.info("outbox sweep relayed messages", count=round_.relayed)
        # Work left over: go round again at once.
        return not round_.finished
