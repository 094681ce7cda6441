"""Jobs used only by the tests (declared at app ready, in the test process and in every
``runworkers`` child). Each test family has its own queue, so one test's leftovers never reach
another's worker."""

from __future__ import annotations

import os
import time

import dramatiq
from django.db import connection, transaction

from composition.broker.configured import configured_broker
from composition.jobs import PermanentError, TransientError, current_message, job
from composition.jobs.middleware.limited_starts import LIMIT_STARTED_AT_OPTION
from composition.jobs.middleware.retries import BACKOFF_OPTION
from composition.outbox import publish
from tests.jobsapp.models import Account, Attempt, Effect

CRASH_QUEUE = "jobs_crash"
RETRY_QUEUE = "jobs_retry"
SLOW_QUEUE = "jobs_slow"
CHECK_QUEUE = "jobs_check"
NOOP_QUEUE = "jobs_noop"


def _record_attempt(key: str) -> int:
    message = current_message()
    attempt = int(message.options.get("retries", 0)) + 1 if message else 1
    backoff_ms = message.options.get(BACKOFF_OPTION) if message else None
    # Committed on its own (autocommit), so the test sees every run, failed ones included.
    Attempt.objects.create(key=key, attempt=attempt, backoff_ms=backoff_ms)
    return attempt


# 25 attempts (at least ten seconds of backoff: a database restart's outage) and a 2 s time limit
# keep its redelivery window near a minute, which a wiped broker's reconciliation waits out.
@job(queue=CRASH_QUEUE, idempotent=True, max_attempts=25, initial_delay_s=0.05, max_delay_s=0.5, timeout_s=2.0)
def crash_effect(key: str) -> None:
    Effect.objects.create(key=key, host=os.environ.get("TEST_HOST", ""))
    # Long enough inside the transaction that kills land mid-job, not only between jobs.
    time.sleep(0.01)


@job(queue=RETRY_QUEUE, max_attempts=5, initial_delay_s=0.05, max_delay_s=0.3)
def flaky(key: str, fail_times: int) -> None:
    if _record_attempt(key) <= fail_times:
        raise TransientError(f"flaky {key} not yet")
    Effect.objects.create(key=key)


@job(queue=RETRY_QUEUE, max_attempts=3, initial_delay_s=0.02, max_delay_s=0.1)
def always_fails(key: str) -> None:
    _record_attempt(key)
    raise ValueError(f"unexpected failure for {key}")


@job(queue=RETRY_QUEUE, max_attempts=5, initial_delay_s=0.02, max_delay_s=0.1)
def refuses(key: str) -> None:
    _record_attempt(key)
    raise PermanentError(f"invoice {key} can never be paid")


@job(queue=RETRY_QUEUE, max_attempts=5, initial_delay_s=0.02, max_delay_s=0.1, permanent=(LookupError,))
def lookup(key: str) -> None:
    _record_attempt(key)
    raise KeyError(key)


@job(queue=CHECK_QUEUE, max_attempts=3, initial_delay_s=0.02, max_delay_s=0.1)
def typed(invoice_id: int, note: str = "") -> None:
    Effect.objects.create(key=f"typed-{invoice_id}-{note}")


@job(queue=CHECK_QUEUE, max_attempts=3, initial_delay_s=0.02, max_delay_s=0.1)
def typed_batch(invoice_ids: list[int]) -> None:
    Effect.objects.create(key="typed-batch-" + "-".join(str(invoice_id) for invoice_id in invoice_ids))


@job(queue=CHECK_QUEUE, max_attempts=1, idempotent=True)
def charge(account: str, key: str) -> None:
    """Fails for good until the account exists: the "fix the data, then replay" case."""
    if not Account.objects.filter(name=account).exists():
        raise PermanentError(f"no account named {account}")
    Effect.objects.create(key=key)


@job(queue=SLOW_QUEUE, max_attempts=3, initial_delay_s=0.05, max_delay_s=0.2, timeout_s=300)
def slow(key: str, hold_s: float, gate: str = "") -> None:
    """Runs ``hold_s`` seconds, or less once the ``gate`` file exists; the effect is written at
    the end, so an interrupted run leaves none."""
    _record_attempt(key)
    deadline = time.monotonic() + hold_s
    # Short sleeps: an asynchronous Shutdown lands between them, not after one long sleep.
    while time.monotonic() < deadline and not (gate and os.path.exists(gate)):
        time.sleep(0.02)
    with transaction.atomic():
        Effect.objects.create(key=key)


@job(queue=SLOW_QUEUE, max_attempts=3, timeout_s=300)
def stubborn(key: str, hold_s: float) -> None:
    """Runs ``hold_s`` seconds whatever is raised into it (a job that catches BaseException):
    the drain's interrupt does not end it."""
    _record_attempt(key)
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        try:
            time.sleep(0.02)
        except BaseException:  # what such a job does
            pass


@job(queue=NOOP_QUEUE, max_attempts=1)
def noop() -> None:
    """The benchmark's job: nothing but the machinery around it."""


# A queue no test publishes to: a worker run for its background components alone consumes it
# (runworkers refuses a queue no job declares).
IDLE_QUEUE = "jobs_idle"


@job(queue=IDLE_QUEUE, max_attempts=1)
def never_sent() -> None:
    """Declares IDLE_QUEUE; nothing sends it."""


RABBIT_QUEUE = "jobs_rabbit"


@job(queue=RABBIT_QUEUE, idempotent=True, max_attempts=3, initial_delay_s=0.05, max_delay_s=0.2)
def rabbit_effect(key: str) -> None:
    """Runs under a RabbitMQ broker in the RabbitMQ tests."""
    Effect.objects.create(key=key)


LOSS_QUEUE, LOSS_PAUSED_QUEUE = "jobs_loss", "jobs_loss_paused"


# Short redelivery windows (2 attempts of at most 2 s, backoff 0.2 s: about 12 s with the
# broker heartbeat and the outbox lease), so a broker loss reconciles them within a test.
@job(queue=LOSS_QUEUE, idempotent=True, max_attempts=2, timeout_s=2, initial_delay_s=0.1, max_delay_s=0.2)
def loss_effect(key: str) -> None:
    Effect.objects.create(key=key)


PARTITION_QUEUE = "jobs_partition"


# Idempotent, a fifth of a second inside its transaction (so a cut lands mid-job), limited to 2 s;
# enough attempts that a retry waiting on a cut host's row lock (lock timeout) still ends in one run.
@job(queue=PARTITION_QUEUE, idempotent=True, max_attempts=20, timeout_s=2, initial_delay_s=0.1, max_delay_s=0.5)
def partition_effect(key: str) -> None:
    Effect.objects.create(key=key, host=os.environ.get("TEST_HOST", ""))
    time.sleep(0.2)


@job(queue=LOSS_PAUSED_QUEUE, idempotent=True, max_attempts=2, timeout_s=2, initial_delay_s=0.1, max_delay_s=0.2)
def loss_effect_paused(key: str) -> None:
    Effect.objects.create(key=key)


@job(queue=LOSS_QUEUE, idempotent=True, max_attempts=2, timeout_s=2, initial_delay_s=60, max_delay_s=60)
def loss_retried(key: str) -> None:
    """Fails its first run, then waits a minute for its retry: its window is over a minute."""
    if _record_attempt(key) == 1:
        raise TransientError(f"{key}: not yet")
    Effect.objects.create(key=key)


QUORUM_QUEUE = "jobs_quorum"


@job(queue=QUORUM_QUEUE, idempotent=True, max_attempts=3, initial_delay_s=0.05, max_delay_s=0.2)
def quorum_effect(key: str) -> None:
    """Runs on RabbitMQ quorum queues in the cluster tests; long enough inside its transaction that
    a node stopping lands mid-job, not only between jobs."""
    Effect.objects.create(key=key)
    time.sleep(0.05)


def _fails_quietly(key: str) -> None:
    raise ValueError(f"no dead letter wanted for {key}")


# A plain Dramatiq actor that opts out of dead letters, as the outbox relay does.
fails_without_dead_letter = dramatiq.actor(
    actor_name="jobsapp_fails_without_dead_letter", queue_name=CHECK_QUEUE, broker=configured_broker(),
    max_retries=0, dead_letter=False,
)(_fails_quietly)


TIME_LIMIT_QUEUE = "jobs_time_limit"


@job(queue=TIME_LIMIT_QUEUE, timeout_s=1, max_attempts=2, initial_delay_s=0.05, max_delay_s=0.1)
def overruns(key: str, run_s: float) -> None:
    """Works ``run_s`` seconds in short steps (a time limit can interrupt between them), then
    writes its effect: an interrupted run leaves none."""
    _record_attempt(key)
    deadline = time.monotonic() + run_s
    while time.monotonic() < deadline:
        time.sleep(0.1)
    Effect.objects.create(key=key)


@job(queue=TIME_LIMIT_QUEUE, timeout_s=1, max_attempts=1)
def overruns_in_a_query(key: str, sleep_s: float) -> None:
    """Overruns inside one query, outside any transaction: the interrupt lands while the query
    is in flight (with the pure-Python psycopg, which waits for the result in Python code)."""
    _record_attempt(key)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [sleep_s])


@job(queue=TIME_LIMIT_QUEUE, timeout_s=1, max_attempts=1, idempotent=True)
def overruns_in_a_transaction(key: str, sleep_s: float) -> None:
    """``overruns_in_a_query`` inside the job's transaction, holding a row lock meanwhile."""
    Effect.objects.create(key=key)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [sleep_s])


@job(queue=TIME_LIMIT_QUEUE, max_attempts=3, initial_delay_s=0.05, max_delay_s=0.1)
def records_its_attempt(key: str) -> None:
    _record_attempt(key)


@job(queue=TIME_LIMIT_QUEUE, timeout_s=3, max_attempts=3, initial_delay_s=0.05, max_delay_s=0.1,
     idempotent=True)
def nearly_overruns(key: str, run_s: float) -> None:
    """Finishes just inside its 3 s limit; its effect commits with the inbox ledger after."""
    _record_attempt(key)
    time.sleep(run_s)
    Effect.objects.create(key=key)


BENCH_QUEUE = "jobs_bench"
# Where the benchmark jobs leave their marks: one Redis list entry "<seq> <unix time at start>".
BENCH_STAMPS_KEY = "bench:job-stamps"


def _stamp(seq: int, key: str = BENCH_STAMPS_KEY) -> None:
    import redis
    from django.conf import settings

    global _stamps_client
    if _stamps_client is None:
        _stamps_client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    _stamps_client.rpush(key, f"{seq} {time.time()}")


_stamps_client = None

POOL_QUEUE = "jobs_pool"
# "<seq> <unix time>" when each holds_its_transaction body started, and when it ended.
POOL_STARTS_KEY, POOL_ENDS_KEY = "pool:starts", "pool:ends"


@job(queue=POOL_QUEUE, max_attempts=1, idempotent=True)
def holds_its_transaction(seq: int, hold_s: float) -> None:
    """An idempotent job whose transaction (behind a transaction pooler: its server connection)
    stays open for ``hold_s`` after its first write; notes when its body started and ended."""
    # The transaction begins on the server with its first statement, not with the atomic block.
    Effect.objects.create(key=f"pool-{seq}")
    _stamp(seq, POOL_STARTS_KEY)
    time.sleep(hold_s)
    _stamp(seq, POOL_ENDS_KEY)


@job(queue=BENCH_QUEUE, max_attempts=1)
def bench_stamp(seq: int) -> None:
    """The latency and throughput benchmarks' job: notes when its body started."""
    _stamp(seq)


@job(queue=BENCH_QUEUE, max_attempts=1, idempotent=True)
def bench_stamp_idempotent(seq: int) -> None:
    """The same under the inbox ledger."""
    _stamp(seq)


@job(queue=BENCH_QUEUE, max_attempts=1)
def bench_effect(seq: int) -> None:
    """A job whose effect is a database row, as the jobs the inbox ledger is for (its own
    transaction, one commit), then its stamp."""
    with transaction.atomic():
        Effect.objects.create(key=f"bench-effect-{seq}")
    _stamp(seq)


@job(queue=BENCH_QUEUE, max_attempts=1, idempotent=True)
def bench_effect_idempotent(seq: int) -> None:
    """The same under the inbox ledger: the row and the ledger's commit together."""
    Effect.objects.create(key=f"bench-effect-{seq}")
    _stamp(seq)


WAKE_QUEUE = "jobs_wake"
# Where wake_stamp leaves its marks: one Redis list entry "<seq> <unix time at start>".
WAKE_STAMPS_KEY = "tests:wake-stamps"


@job(queue=WAKE_QUEUE, max_attempts=1)
def wake_stamp(seq: int) -> None:
    """Notes when its body started, for the consumer wake-up tests (tests/broker/test_redis.py)."""
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.CACHES["default"]["LOCATION"]).rpush(WAKE_STAMPS_KEY, f"{seq} {time.time()}")


CRASH_PLAIN_QUEUE = "jobs_crash_plain"


@job(queue=CRASH_PLAIN_QUEUE, max_attempts=50, initial_delay_s=0.05, max_delay_s=0.5)
def crash_effect_plain(key: str) -> None:
    """``crash_effect`` without the inbox ledger (the chaos soak's non-idempotent twin): its effect
    commits on its own, so a redelivered message shows up as a second ``Effect`` row."""
    Effect.objects.create(key=key, host=os.environ.get("TEST_HOST", ""))
    time.sleep(0.01)


ELSEWHERE_QUEUE = "jobs_billing_elsewhere"


@job(queue=ELSEWHERE_QUEUE, max_attempts=1)
def receipt_elsewhere(payment_id: int) -> None:
    """A receipt job on another queue: the billing service publishes to it when given it."""
    Effect.objects.create(key=f"receipt-elsewhere-{payment_id}")


ORDER_QUEUE = "jobs_order"


@job(queue=ORDER_QUEUE, max_attempts=1)
def record_start(key: str, seq: int) -> None:
    """Notes that it started (an ``Effect`` "<key>:<seq>", committed at once, before anything
    else): under one worker thread the effects' ids are the jobs' start order. The short wait
    keeps the worker behind the publisher, so messages queue up and its prefetch is used."""
    Effect.objects.create(key=f"{key}:{seq}")
    time.sleep(0.02)


SCHEDULE_QUEUE = "jobs_schedule"


@job(queue=SCHEDULE_QUEUE, max_attempts=3, initial_delay_s=0.2, idempotent=True)
def scheduled_effect(label: str) -> None:
    """A scheduled run's effect, once per delivery's ledger: an Effect keyed by the label, the
    tick (``current_fire_at``) and whether it was a catch-up."""
    from composition.schedules import current_fire_at, current_tick_is_catch_up

    fire_at = current_fire_at()
    mark = "catch-up" if current_tick_is_catch_up() else "on-time"
    Effect.objects.create(key=f"{label}|{fire_at.isoformat() if fire_at else 'none'}|{mark}")


@job(queue=SCHEDULE_QUEUE, max_attempts=1)
def scheduled_slow(label: str, seconds: float) -> None:
    """A scheduled run longer than its period: Effects mark its start and its end."""
    from composition.schedules import current_fire_at

    fire_at = current_fire_at()
    tick = fire_at.isoformat() if fire_at else "none"
    Effect.objects.create(key=f"{label}|start|{tick}")
    time.sleep(seconds)
    Effect.objects.create(key=f"{label}|end|{tick}")


@job(queue=SCHEDULE_QUEUE, max_attempts=1)
def scheduled_skip(label: str) -> None:
    """A scheduled run that ends itself with Dramatiq's SkipMessage, after marking its start."""
    from composition.schedules import current_fire_at

    fire_at = current_fire_at()
    Effect.objects.create(key=f"{label}|run|{fire_at.isoformat() if fire_at else 'none'}")
    raise dramatiq.middleware.SkipMessage


PAUSE_QUEUE = "jobs_pause"
# Redis list of "<key> <unix time>" per run's start, written outside the job's transaction: a
# run that started and was rolled back, or ran twice, still shows.
PAUSE_STARTS_KEY = "tests:pause-starts"


def pause_starts_client():  # type: ignore[no-untyped-def]
    import redis
    from django.conf import settings

    return redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])


@job(queue=PAUSE_QUEUE, idempotent=True, max_attempts=3, initial_delay_s=0.05, max_delay_s=0.2)
def pause_effect(key: str, hold_s: float) -> None:
    """Notes its start in Redis at once, holds ``hold_s``, then its effect (once, by the ledger)."""
    with pause_starts_client() as client:
        client.rpush(PAUSE_STARTS_KEY, f"{key} {time.time()}")
    time.sleep(hold_s)
    Effect.objects.create(key=key)


@job(queue=PAUSE_QUEUE, max_attempts=1)
def pause_run(key: str, hold_s: float) -> None:
    """``pause_effect`` without the ledger: a message delivered twice runs twice, and shows."""
    with pause_starts_client() as client:
        client.rpush(PAUSE_STARTS_KEY, f"{key} {time.time()}")
    time.sleep(hold_s)
    Effect.objects.create(key=key)


SHED_ESSENTIAL_QUEUE = "jobs_shed_essential"
SHED_OPTIONAL_QUEUE = "jobs_shed_optional"


@job(queue=SHED_ESSENTIAL_QUEUE, max_attempts=1)
def shed_essential(key: str) -> None:
    """Essential work: its queue's pressure sheds the optional one."""
    Effect.objects.create(key=key)


@job(queue=SHED_OPTIONAL_QUEUE, max_attempts=1)
def shed_optional(key: str) -> None:
    """Non-essential work: shed while the essential queue is behind; its Effect's time is its start."""
    Effect.objects.create(key=key)


CHART_QUEUE = "jobs_chart"


@job(queue=CHART_QUEUE, max_attempts=1)
def chart_step(key: str, hold_s: float) -> None:
    """A step of a queue that drains at a known pace, for the operations page's charts."""
    time.sleep(hold_s)
    Effect.objects.create(key=key)


# Limits (tests/scenarios/test_job_limits.py): each run notes itself in the cache's Redis, on
# the Redis server's clock, outside the job's transaction.
LIMIT_QUEUE = "jobs_limits"
LIMIT_CONCURRENCY = 5
LIMIT_RATE = "50/5s"
# A set of "<pid>:<key>" while a run holds its body, and a list of "<key> <server time> <retries>"
# per start.
LIMIT_RUNNING_KEY = "tests:limit-running"
LIMIT_STARTS_KEY = "tests:limit-starts"


def _server_time(client) -> float:  # type: ignore[no-untyped-def]
    seconds, micros = client.time()
    return seconds + micros / 1e6


def _limited_body(key: str, hold_s: float) -> None:
    message = current_message()
    retries = int(message.options.get("retries", 0)) if message else 0
    member = f"{os.getpid()}:{key}"
    with pause_starts_client() as client:
        client.sadd(LIMIT_RUNNING_KEY, member)
        # The start's time as the limits counted it, not this line's: on a busy machine the body
        # begins a few hundred milliseconds after its admission.
        started_at = message.options[LIMIT_STARTED_AT_OPTION] if message else _server_time(client)
        client.rpush(LIMIT_STARTS_KEY, f"{key} {started_at} {retries}")
    try:
        time.sleep(hold_s)
        Effect.objects.create(key=key)
    finally:
        with pause_starts_client() as client:
            client.srem(LIMIT_RUNNING_KEY, member)


@job(queue=LIMIT_QUEUE, concurrency=LIMIT_CONCURRENCY, idempotent=True, max_attempts=1)
def limited_call(key: str, hold_s: float) -> None:
    """At most LIMIT_CONCURRENCY at once in the cluster."""
    _limited_body(key, hold_s)


@job(queue=LIMIT_QUEUE, idempotent=True, max_attempts=1)
def unlimited_call(key: str, hold_s: float) -> None:
    """``limited_call`` without its limit: the baseline."""
    _limited_body(key, hold_s)


@job(queue=LIMIT_QUEUE, rate=LIMIT_RATE, idempotent=True, max_attempts=1)
def rated_call(key: str, hold_s: float) -> None:
    """At most 50 starts in any 5 s of the Redis server's clock."""
    _limited_body(key, hold_s)


# Priorities (tests/scenarios/test_queue_priorities.py): a critical job notes how long after its
# publication it started; bulk jobs hold a thread.
CRITICAL_QUEUE = "jobs_critical"
BULK_QUEUE = "jobs_bulk"
PRIORITY_STARTS_KEY = "tests:priority-starts"


@job(queue=CRITICAL_QUEUE, max_attempts=1)
def critical_step(key: str, published_at: float) -> None:
    with pause_starts_client() as client:
        client.rpush(PRIORITY_STARTS_KEY, f"critical {key} {time.time() - published_at}")
    Effect.objects.create(key=key)


@job(queue=BULK_QUEUE, max_attempts=1)
def bulk_step(key: str, hold_s: float) -> None:
    with pause_starts_client() as client:
        client.rpush(PRIORITY_STARTS_KEY, f"bulk {key} {time.time()}")
    time.sleep(hold_s)
    Effect.objects.create(key=key)


# composition.testing.run_queued_jobs's tests: a job that publishes another, on a queue of their own.
INLINE_QUEUE = "jobs_inline"


@job(queue=INLINE_QUEUE, max_attempts=3, initial_delay_s=30.0, max_delay_s=30.0)
def inline_chain(key: str, left: int) -> None:
    """Writes its effect and, while ``left`` is above 0, publishes the next link of the chain."""
    with transaction.atomic():
        Effect.objects.create(key=f"{key}-{left}")
        if left > 0:
            publish(inline_chain, {"key": key, "left": left - 1})


# A fixed 2 s backoff: a retry comes due well after a run without ``delayed`` has returned.
@job(queue=INLINE_QUEUE, max_attempts=3, initial_delay_s=2.0, max_delay_s=2.0)
def inline_flaky(key: str, fail_times: int) -> None:
    if _record_attempt(key) <= fail_times:
        raise TransientError(f"{key} not yet")
    Effect.objects.create(key=key)


# Jobs as deploys change them (chosen per process by environment variables).
from tests.jobsapp import deploys  # noqa: E402, F401

