"""The relay sweeper: a ``runworkers`` component that runs the relay every few seconds.

The after-commit nudge gives low latency; the sweep gives the guarantee: a process that dies
between its commit and its nudge, a nudge lost with a broker blip, or a relay that crashed
holding leases all end with the rows relayed at the next sweep (after the lease, for leased
rows). Each sweep also samples the outbox gauges.
"""

from __future__ import annotations

import threading

import structlog
from django.db import close_old_connections, connection
from dramatiq.broker import Broker

from composition.conf import conf
from composition.outbox.relay import RelayRound, relay_actor, relay_for

__all__ = ["RelaySweeperComponent"]

log = structlog.get_logger("composition.outbox.sweeper")

# A sweep that keeps finding work ends after this long (and the next starts at once), so that
# stopping is prompt and the gauges are sampled.
SWEEP_BUDGET_S = 5.0


class RelaySweeperComponent:
    """Sweeps the outbox every ``interval_s`` (default ``OUTBOX_SWEEP_INTERVAL_S``).

    Constructing it declares the relay actor on ``broker``, so the worker component (whose
    Dramatiq worker is created at start) also consumes the relay's nudges.
    """

    name = "outbox-relay"
    depends_on = ("database", "broker")

    def __init__(self, broker: Broker, *, interval_s: float | None = None) -> None:
        self.broker = broker
        self._interval_s = interval_s
        relay_actor(broker)
        self.relay = relay_for(broker)
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def interval_s(self) -> float:
        return self._interval_s or float(conf.OUTBOX_SWEEP_INTERVAL_S)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="outbox-sweeper", daemon=True)
        self._thread.start()

    def sweep(self) -> RelayRound:
        """One sweep: relay what is pending for a bounded time, then sample the gauges."""
        from composition.outbox.ops import refresh_gauges

        close_old_connections()
        round_ = self.relay.nudged(max_s=SWEEP_BUDGET_S)
        refresh_gauges()
        return round_

    def _loop(self) -> None:
        try:
            while not self._stop_event.is_set():
                finished = True
                try:
                    round_ = self.sweep()
                    finished = round_.finished
                    if round_.relayed:
                        log.info("outbox sweep relayed messages", count=round_.relayed)
                except Exception as exc:  # a broker or database blip must not end the sweeper
                    log.warning("outbox sweep failed", error=f"{type(exc).__name__}: {exc}")
                # Work left over: go round again at once (checking for a stop in between).
                self._stop_event.wait(self.interval_s if finished else 0)
        finally:
            connection.close()

    def alive(self) -> bool:
        return self._thread is None or self._thread.is_alive() or self._stop_event.is_set()

    def begin_drain(self) -> None:
        self._stop_event.set()

    def stop(self, timeout_s: float) -> None:
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
