"""Firing a schedule's due ticks, exactly once across every scheduler.

Per schedule, one transaction: lock its state row (``FOR UPDATE SKIP LOCKED``: a scheduler that
finds it locked leaves it to the one holding it), take the ticks after the watermark up to the
database's now, decide each one's outcome (``plan``), insert the ticks that fire
(``INSERT … ON CONFLICT DO NOTHING RETURNING``) and publish their jobs to the outbox, then
advance the watermark. The tick rows, the outbox rows and the watermark commit together.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import takewhile

import structlog
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from composition.conf import conf
from composition.jobs.middleware.run_signals import FOLLOW_RUNS_HEADER
from composition.metrics import SCHEDULE_LAG_SECONDS, SCHEDULE_NEXT_FIRE_TIMESTAMP, SCHEDULE_TICKS_TOTAL
from composition.outbox.publish import publish_with_headers
from composition.pauses import Pause
from composition.schedules.declaration import SCHEDULE_HEADER, Schedule
from composition.schedules.models import ScheduleState, ScheduleTick
from composition.schedules.ticks import next_tick, ticks_after

__all__ = ["MAX_TICKS_PER_ROUND", "Clock", "Plan", "database_now", "fire_due", "plan", "run_now", "superseded"]

log = structlog.get_logger("composition.schedules")

# The most recent due ticks one round keeps to decide on (catch_up_max is at most this); older
# ones, after a long outage of a frequent schedule, are only counted.
MAX_TICKS_PER_ROUND = 10_000
# How long a fired tick whose run has not started counts as pending (overlap="skip",
# max_pending): past it a lost run no longer holds the schedule back.
PENDING_LEASE = timedelta(hours=1)

Clock = Callable[[], datetime]


def database_now() -> datetime:
    """The database's clock (every host's scheduler reads the same one)."""
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        now: datetime = cursor.fetchone()[0]
    return now


@dataclass
class Plan:
    """What one round does with a schedule's due ticks."""

    fire: list[tuple[datetime, bool]] = field(default_factory=list)  # (tick, is a catch-up), oldest first
    missed: int = 0
    skipped: int = 0
    paused: int = 0


def plan(declared: Schedule, due: Sequence[datetime], now: datetime, *, running: int) -> Plan:
    """The outcome of each due tick (all later than the watermark, none after ``now``).

    A tick at most ``grace`` late fires as on time; older ones were missed, and the catch-up
    policy says which of them fire: ``latest`` the most recent one unless a tick fires on time
    (it supersedes the catch-up), ``all`` those within the window, at most ``catch_up_max``
    (the most recent ones). ``running`` is how many earlier runs are still pending or running:
    ``overlap="skip"`` fires nothing while there is one and at most one tick per round, and
    ``max_pending`` caps the runs waiting at once; what they hold back is skipped."""
    result = Plan()
    on_time = [tick for tick in due if now - tick <= declared.grace]
    late = [tick for tick in due if now - tick > declared.grace]
    catch_ups: list[datetime] = []
    if declared.catch_up == "latest" and late and not on_time:
        catch_ups = late[-1:]
    elif declared.catch_up == "all" and declared.catch_up_window is not None:
        window = declared.catch_up_window
        catch_ups = [tick for tick in late if now - tick <= window][-declared.catch_up_max:]
    result.missed = len(late) - len(catch_ups)
    wanted = [(tick, True) for tick in catch_ups] + [(tick, False) for tick in on_time]
    room = len(wanted)
    if declared.overlap == "skip":
        room = 0 if running else min(room, 1)
    if declared.max_pending is not None:
        room = min(room, max(declared.max_pending - running, 0))
    # What fits is the most recent: a schedule that fell behind runs its latest work.
    result.fire = wanted[len(wanted) - room:]
    result.skipped = len(wanted) - room
    return result


def _followed(declared: Schedule) -> bool:
    """Whether its runs are followed (started, ended): only where the overlap rule needs them."""
    return declared.overlap == "skip" or declared.max_pending is not None


def _running(name: str, now: datetime) -> int:
    # Regular ticks only: a run by hand neither suppresses nor is suppressed by one.
    return ScheduleTick.objects.filter(schedule=name, manual=False, finished_at__isnull=True,
                                       lease_until__gt=now).count()


def _insert_tick(declared: Schedule, fire_at: datetime, *, catch_up: bool, manual: bool, now: datetime) -> int | None:
    table = connections[DEFAULT_DB_ALIAS].ops.quote_name(ScheduleTick._meta.db_table)
    # A run nobody follows never reports its end: it gets no lease, or a schedule switched to
    # overlap="skip" would take it for pending and skip every tick for an hour.
    lease_until = now + PENDING_LEASE if _followed(declared) else None
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (schedule, fire_at, manual, catch_up, created_at, lease_until)"
            " VALUES (%s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (schedule, fire_at) WHERE NOT manual DO NOTHING RETURNING id",
            [declared.name, fire_at, manual, catch_up, now, lease_until])
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def _publish(declared: Schedule, tick_id: int, fire_at: datetime, *, catch_up: bool, manual: bool) -> None:
    header = {"name": declared.name, "tick": tick_id, "fire_at": fire_at.isoformat(),
              "catch_up": catch_up, "manual": manual}
    follow = {FOLLOW_RUNS_HEADER: True} if _followed(declared) else {}
    publish_with_headers(declared.actor_name, declared.payload, headers={SCHEDULE_HEADER: header, **follow})


def _paused_span(name: str) -> tuple[bool, datetime, datetime] | None:
    """(paused now, since when the last pause began, when it last changed) of schedule ``name``,
    None when it was never paused. A pause from before its start was kept counts from the start
    of time."""
    row = Pause.objects.filter(kind=Pause.SCHEDULE, name=name).values_list("paused", "paused_at", "changed_at").first()
    if row is None:
        return None
    paused, paused_at, changed_at = row
    return paused, paused_at or datetime.min.replace(tzinfo=changed_at.tzinfo), changed_at


def _count(name: str, outcome: str, amount: int) -> None:
    if amount:
        SCHEDULE_TICKS_TOTAL.labels(schedule=name, outcome=outcome).inc(amount)


def superseded(state: ScheduleState, declared: Schedule, now: datetime) -> bool:
    """Whether ``declared`` is the timing a deploy replaced less than ``DEPLOY_WINDOW_S`` ago: a
    host still running the code from before it then leaves the schedule to the new timing's
    hosts. Taking it back would restart it from now on every round of either, and in a rolling
    deploy almost nothing would fire; past the window (a rollback) the timing changes again."""
    changed_at = state.timing_changed_at
    return (bool(state.previous_timing) and declared.timing == state.previous_timing and changed_at is not None
            and now - changed_at < timedelta(seconds=float(conf.DEPLOY_WINDOW_S)))


def fire_due(declared: Schedule, clock: Clock = database_now) -> Plan | None:
    """Fire what is due of ``declared``: None when another scheduler holds it or nothing is due.

    A schedule without a state row starts from now (no backfill on its first deploy)."""
    with transaction.atomic():
        now = clock()
        state = ScheduleState.objects.select_for_update(skip_locked=True).filter(name=declared.name).first()
        if state is None:
            # New, or held by another scheduler (then the insert finds its row and does nothing).
            ScheduleState.objects.bulk_create([ScheduleState(name=declared.name, watermark=now, timing=declared.timing,
                                                             updated_at=now)], ignore_conflicts=True)
            return None
        if state.timing != declared.timing:
            if superseded(state, declared, now):
                return None
            # A new period, expression, zone or start: the new timing's ticks since the watermark
            # were not missed by a scheduler that was down, so it starts from now, as a new
            # schedule does (a state from before timings were kept only records its timing).
            # The scheduler sees the change on its first round after the deploy, not at the new
            # timing's first tick, which then fires.
            restart = bool(state.timing)
            if restart:
                log.info("schedule timing changed, starting from now", schedule=declared.name,
                         was=state.timing, now=declared.timing)
                state.previous_timing, state.timing_changed_at, state.watermark = state.timing, now, now
            state.timing, state.updated_at = declared.timing, now
            state.save(update_fields=["watermark", "timing", "previous_timing", "timing_changed_at", "updated_at"])
            if restart:
                return None
        # After a long outage only the most recent ticks can fire (on time, or caught up): the
        # older ones are counted as missed without being kept.
        due: deque[datetime] = deque(maxlen=MAX_TICKS_PER_ROUND)
        evaluated = 0
        for tick in takewhile(lambda tick: tick <= now, ticks_after(declared, state.watermark)):
            due.append(tick)
            evaluated += 1
        older = evaluated - len(due)
        if not due:  # another scheduler fired it between this one's read and its lock
            return None
        last = due[-1]
        span = _paused_span(declared.name)
        paused = span is not None and span[0]
        # The ticks up to the pause's end (now, while paused) are not the catch-up policy's: those
        # due while paused count as paused, and those from before it began, which no scheduler
        # decided then, as missed. A resume fires the next tick only, however the rounds fell.
        through = None if span is None else (now if paused else span[2])
        kept = [tick for tick in due if through is None or tick > through]
        held = len(due) - len(kept)
        before = 0 if span is None else sum(1 for tick in takewhile(lambda tick: tick < span[1], due))
        running = 0 if paused or not _followed(declared) else _running(declared.name, now)
        decided = plan(declared, kept, now, running=running)
        decided.paused += held - before
        decided.missed += before
        if held and span is not None and due[0] >= span[1]:
            decided.paused += older
        else:
            decided.missed += older
        fired = []
        for fire_at, catch_up in decided.fire:
            tick_id = _insert_tick(declared, fire_at, catch_up=catch_up, manual=False, now=now)
            if tick_id is None:  # fired already: the constraint, not the lock, has the last word
                continue
            _publish(declared, tick_id, fire_at, catch_up=catch_up, manual=False)
            fired.append((fire_at, catch_up))
        caught_up = sum(1 for _, catch_up in fired if catch_up)
        state.watermark = last
        state.fired += len(fired) - caught_up
        state.caught_up += caught_up
        state.missed += decided.missed
        state.skipped += decided.skipped
        state.paused += decided.paused
        if fired:
            state.last_fired_at = fired[-1][0]
        state.updated_at = now
        state.save()
    _count(declared.name, "fired", len(fired) - caught_up)
    _count(declared.name, "caught_up", caught_up)
    _count(declared.name, "missed", decided.missed)
    _count(declared.name, "skipped_overlap", decided.skipped)
    _count(declared.name, "paused", decided.paused)
    for fire_at, _ in fired:
        SCHEDULE_LAG_SECONDS.labels(schedule=declared.name).observe(max((now - fire_at).total_seconds(), 0.0))
    # Paused ticks are not logged: the pause was, and they are counted.
    if decided.missed:
        log.warning("schedule ticks missed", schedule=declared.name, missed=decided.missed,
                    policy=declared.catch_up, through=last.isoformat())
    if decided.skipped:
        log.info("schedule ticks skipped", schedule=declared.name, skipped=decided.skipped,
                 overlap=declared.overlap, max_pending=declared.max_pending)
    for fire_at, catch_up in fired:
        log.info("schedule fired", schedule=declared.name, fire_at=fire_at.isoformat(), catch_up=catch_up,
                 lag_s=round((now - fire_at).total_seconds(), 3))
    _set_next_fire(declared, last)
    return decided


def _set_next_fire(declared: Schedule, after: datetime) -> None:
    try:
        upcoming = next_tick(declared, after)
    except StopIteration:
        return
    SCHEDULE_NEXT_FIRE_TIMESTAMP.labels(schedule=declared.name).set(upcoming.timestamp())


def run_now(declared: Schedule, *, clock: Clock = database_now) -> int:
    """Fire a manual run of ``declared`` now: its own tick row (``manual``), so it neither
    suppresses nor is suppressed by a regular tick. Returns the tick's id."""
    with transaction.atomic():
        # To the microsecond: a run at 12:00:00.7 must not share current_fire_at() with the
        # regular 12:00:00 tick, or a job keyed on it takes one for a repeat of the other.
        now = clock()
        tick_id = _insert_tick(declared, now, catch_up=False, manual=True, now=now)
        assert tick_id is not None  # manual ticks are outside the unique constraint
        _publish(declared, tick_id, now, catch_up=False, manual=True)
    _count(declared.name, "manual", 1)
    log.info("schedule run by hand", schedule=declared.name, fire_at=now.isoformat())
    return tick_id
