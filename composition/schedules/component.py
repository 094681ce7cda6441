"""``SchedulerComponent``: fires every declared schedule's due ticks, on every ``runworkers``.

There is no leader: each host's scheduler reads every schedule's watermark each round and fires
what is due; the state row's lock and the tick's unique constraint make each tick fire once
(``firing``). Rounds run when the next tick is due, at least every second; after a failed round
the wait doubles instead, up to ``FAILED_ROUND_MAX_WAIT_S``, until a round succeeds. One schedule
that fails is tried again every round, and its failure said again once a minute.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import structlog
from django.db import close_old_connections

from composition.conf import conf
from composition.errors import described
from composition.jobs.policy import backoff_s
from composition.lifecycle.periodic import PeriodicComponent, RepeatedFailures
from composition.metrics import SCHEDULE_NEXT_FIRE_TIMESTAMP, SCHEDULER_CLOCK_SKEW_SECONDS
from composition.schedules.declaration import Schedule, declared
from composition.schedules.firing import Clock, database_now, fire_due, superseded
from composition.schedules.models import ScheduleState
from composition.schedules.problems import problems
from composition.schedules.ticks import next_tick

__all__ = ["SchedulerComponent"]

log = structlog.get_logger("composition.schedules")

# The longest wait between two rounds, and the shortest (a round right at a tick may run a
# little before the database's clock reaches it).
MAX_WAIT_S = 1.0
MIN_WAIT_S = 0.02
# The waits after failed rounds in a row: doubling (jittered, as a job's retries) from the first
# up to the last. A failed round keeps no next tick to wait for, and retrying every MIN_WAIT_S
# queried a database without its migrations 40 times a second; at most this late, a tick due
# during an outage fires once the database is back.
FAILED_ROUND_FIRST_WAIT_S = 0.1
FAILED_ROUND_MAX_WAIT_S = 5.0


def host_now() -> datetime:
    return datetime.now(UTC)


class SchedulerComponent(PeriodicComponent):
    """Fires due ticks of ``schedules`` (default: every valid declared schedule).

    ``clock`` is the database's clock and ``host_clock`` this host's, both injectable so tests
    drive DST days and skew without waiting; ticks follow ``clock`` only, and the difference
    between the two is exported as ``composition_scheduler_clock_skew_seconds``."""

    name = "scheduler"
    depends_on = ("database", "broker")
    failure_event = "scheduler round failed"
    logger = log

    def __init__(self, schedules: list[Schedule] | None = None, *, clock: Clock = database_now,
                 host_clock: Clock = host_now) -> None:
        super().__init__(interval_s=MAX_WAIT_S)
        self._given = schedules
        self.clock = clock
        self.host_clock = host_clock
        self._wait_s = MIN_WAIT_S
        self._active: list[Schedule] | None = None
        # (schedule, the timing it is left to) already logged: one line per hand-over, not per round.
        self._left_to: set[tuple[str, str]] = set()
        # A failing schedule's failures: it is tried again every round, but said once a minute.
        self._failing: dict[str, RepeatedFailures] = {}

    def schedules(self) -> list[Schedule]:
        if self._given is not None:
            return list(self._given)
        valid = []
        for candidate in declared().values():
            found = problems(candidate)
            if found:
                log.error("schedule not run: it has problems", schedule=candidate.name, problems=found)
            else:
                valid.append(candidate)
        return valid

    def start(self) -> None:
        self._active = self.schedules()
        log.info("scheduler started", schedules=[entry.name for entry in self._active])
        super().start()

    def active(self) -> list[Schedule]:
        """What this scheduler fires: ``schedules()`` as of its start (or its first round)."""
        if self._active is None:
            self._active = self.schedules()
        return self._active

    def _leave(self, entry: Schedule, state: ScheduleState) -> None:
        """Say once that this host leaves ``entry`` to the hosts of its new timing, and until when:
        after a rollback no such host is left, and the schedule fires nothing until then."""
        if state.timing_changed_at is None:
            return
        until = state.timing_changed_at + timedelta(seconds=float(conf.DEPLOY_WINDOW_S))
        # When it may fire again at the latest, for ScheduleNotFiring: no gauge would outlive it.
        SCHEDULE_NEXT_FIRE_TIMESTAMP.labels(schedule=entry.name).set(until.timestamp())
        if (entry.name, state.timing) in self._left_to:
            return
        self._left_to.add((entry.name, state.timing))
        log.warning("schedule left to the hosts of its new timing", schedule=entry.name, timing=entry.timing,
                    new_timing=state.timing, until=until.isoformat(),
                    hint="a deploy changed its timing; if it was rolled back, this host takes the schedule back "
                         "then (DEPLOY_WINDOW_S), and nothing fires meanwhile")

    @property
    def interval_s(self) -> float:
        if self.failed_rounds:
            return backoff_s(self.failed_rounds - 1, initial_s=FAILED_ROUND_FIRST_WAIT_S,
                             max_s=FAILED_ROUND_MAX_WAIT_S)
        return self._wait_s

    def tick(self) -> bool:
        if not self.active():
            return False  # nothing declared: no round, no query
        close_old_connections()
        host_now, now = self.host_clock(), self.clock()
        SCHEDULER_CLOCK_SKEW_SECONDS.set((host_now - now).total_seconds())
        # One query for every watermark: a schedule takes its lock and transaction only when a
        # tick of it is due (or it has no state yet, or a new timing).
        states = {state.name: state for state in ScheduleState.objects.filter(
            name__in=[entry.name for entry in self.active()]).only(
            "name", "watermark", "timing", "previous_timing", "timing_changed_at")}
        upcoming: list[datetime] = []
        for entry in self.active():
            if self.stopping():
                return False
            state = states.get(entry.name)
            if state is not None and state.timing != entry.timing:
                if superseded(state, entry, now):
                    self._leave(entry, state)
                    continue  # the hosts of the deploy that changed its timing fire it
                # Otherwise fire_due takes the new timing now, so that its first tick fires.
            elif state is not None:
                try:
                    due_at = next_tick(entry, state.watermark)
                except StopIteration:  # an expression with no tick left
                    continue
                if due_at > now:
                    upcoming.append(due_at)
                    SCHEDULE_NEXT_FIRE_TIMESTAMP.labels(schedule=entry.name).set(due_at.timestamp())
                    continue
            try:
                fire_due(entry, self.clock)
            except Exception as exc:  # one schedule's failure must not hold up the others
                self._failing.setdefault(entry.name, RepeatedFailures(log, "schedule round failed",
                                                                      schedule=entry.name)).failed(described(exc))
                continue
            failures = self._failing.pop(entry.name, None)
            if failures is not None:
                failures.succeeded()
            upcoming.append(now)  # fired or held elsewhere: look again soon
        # Until the next tick (a little past it, so the round finds it due), at most MAX_WAIT_S.
        wait_s = (min(upcoming) - now).total_seconds() + 0.005 if upcoming else MAX_WAIT_S
        self._wait_s = min(max(wait_s, MIN_WAIT_S), MAX_WAIT_S)
        return False
