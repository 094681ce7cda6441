"""Every Prometheus metric composition exports, defined once, units in the names.

Multiprocess mode: when ``PROMETHEUS_MULTIPROC_DIR`` is set in the environment before
``prometheus_client`` is first imported, every process writes its samples there and
``/metrics`` merges them. The folder is created here when it does not exist yet.
"""

from __future__ import annotations

import os


def _ensure_multiprocess_directory() -> None:
    """Create ``PROMETHEUS_MULTIPROC_DIR`` when it is set but missing: every metric below opens
    its file there as it is defined, during Django's start-up, before a system check could say
    what is wrong, so a missing folder would crash ``migrate``, ``runworkers`` and the web."""
    # The lower-case name is prometheus_client's older spelling, which it still reads.
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir")  # noqa: SIM112
    if path:
        os.makedirs(path, exist_ok=True)


_ensure_multiprocess_directory()

from typing import Generic, TypeVar  # noqa: E402

from prometheus_client import Counter, Gauge, Histogram  # noqa: E402  (after the folder exists)
from prometheus_client.metrics import MetricWrapperBase  # noqa: E402

# The label of a cache key or lock name without a namespace: a key such as f"user-{id}" would
# otherwise be a label value per user.
NO_NAMESPACE_LABEL = "(none)"


def key_label(key: str) -> str:
    """The bounded label of a cache key or lock name: its namespace (the text before its first
    ``:``), or ``NO_NAMESPACE_LABEL`` when it has none."""
    namespace, colon, _ = key.partition(":")
    return namespace if colon and namespace else NO_NAMESPACE_LABEL

__all__ = [
    "COMPONENT_START_SECONDS",
    "COMPONENT_STOP_SECONDS",
    "HEALTH_CHECK_SECONDS",
    "HEALTH_CHECK_UP",
    "NO_NAMESPACE_LABEL",
    "WORKER_HEARTBEAT_TIMESTAMP",
    "LabelledChildren",
    "key_label",
]

_M = TypeVar("_M", bound=MetricWrapperBase)


class LabelledChildren(Generic[_M]):
    """``metric.labels(*values)``, looked up once per label values and kept: ``labels()`` takes
    the metric's lock and rebuilds its key on every call, which the worker pays several times a
    job. A kept child stays the metric's own (nothing here removes or clears labels)."""

    def __init__(self, metric: _M) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], _M] = {}

    def __call__(self, *values: str) -> _M:
        child = self._children.get(values)
        if child is None:  # two threads may both look it up: labels() gives them the same child
            child = self._children[values] = self.metric.labels(*values)
        return child


COMPONENT_START_SECONDS = Histogram(
    "composition_component_start_seconds", "Time a component took to start.", ["component"],
)
COMPONENT_STOP_SECONDS = Histogram(
    "composition_component_stop_seconds", "Time a component took to stop.", ["component", "status"],
)
HEALTH_CHECK_SECONDS = Histogram(
    "composition_health_check_seconds", "Duration of one dependency probe.", ["dependency"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0),
)
HEALTH_CHECK_UP = Gauge(
    "composition_health_check_up", "1 when the last probe of a dependency succeeded.", ["dependency"],
    multiprocess_mode="livemostrecent",
)
# Labelled by role (only "worker"), so that a process that never beats (the web) exports no
# sample: an unlabelled gauge is written at 0 by every process, and the web's 0 read as a worker
# that had not beaten since 1970.
WORKER_HEARTBEAT_TIMESTAMP = Gauge(
    "composition_worker_heartbeat_timestamp_seconds",
    "Unix time of a worker process's last heartbeat (its beat thread runs; the cluster's Redis record of "
    "it may fail meanwhile).", ["role"],
    multiprocess_mode="max",
)

# --- cache-aside and locks (composition.cache, composition.locks) ---------------------------
# Labels stay bounded: a cache "pattern" defaults to the key's namespace (the text before its
# first ":"), and a lock "name" label is the lock's namespace, never the full key.
__all__ += [
    "CACHE_COALESCED", "CACHE_ERRORS", "CACHE_HITS", "CACHE_INVALIDATIONS", "CACHE_LEASE_REJECTIONS",
    "CACHE_MISSES", "CACHE_REBUILD_SECONDS", "CACHE_STALE_SERVED", "LOCK_ACQUIRE", "LOCK_FENCE_REJECTIONS",
    "LOCK_HOLD_SECONDS", "LOCK_WAIT_SECONDS",
]
_LOCK_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

CACHE_HITS = Counter("composition_cache_hits_total", "cache_aside calls served a fresh cached value.",
                     ["pattern"])
CACHE_MISSES = Counter("composition_cache_misses_total", "cache_aside calls that found no fresh value.",
                       ["pattern"])
CACHE_STALE_SERVED = Counter("composition_cache_stale_served_total",
                             "cache_aside calls served a stale value while another caller rebuilt it.",
                             ["pattern"])
CACHE_COALESCED = Counter("composition_cache_coalesced_total",
                          "cache_aside calls that waited for a rebuild already running in this process.",
                          ["pattern"])
CACHE_ERRORS = Counter("composition_cache_errors_total",
                       "cache_aside calls degraded to the loader (reason: redis_error, breaker_open, "
                       "lease_wait_timeout, unreadable_entry).", ["pattern", "reason"])
CACHE_LEASE_REJECTIONS = Counter("composition_cache_lease_rejections_total",
                                 "Rebuild leases refused (stage acquire: another caller is rebuilding; "
                                 "stage fill: an invalidation revoked the lease, the value was not cached).",
                                 ["pattern", "stage"])
CACHE_REBUILD_SECONDS = Histogram("composition_cache_rebuild_seconds", "Loader run time of one rebuild.",
                                  ["pattern"], buckets=_LOCK_BUCKETS)
CACHE_INVALIDATIONS = Counter("composition_cache_invalidations_total",
                              "Invalidations by outcome: applied, deferred (left in PostgreSQL for the "
                              "replay: Redis unreachable, breaker open or apply failed), replayed, lost "
                              "(neither worked).", ["outcome"])
# At 0 in every process from the start: a series first seen at 1 has no increase(), so a process's
# first lost invalidation fired no CacheInvalidationLost.
for _outcome in ("applied", "deferred", "replayed", "lost"):
    CACHE_INVALIDATIONS.labels(_outcome)
LOCK_ACQUIRE = Counter("composition_lock_acquire_total",
                       "Lock acquisitions by kind (row, advisory, redis), name and outcome "
                       "(acquired, busy, unavailable).", ["kind", "name", "outcome"])
LOCK_WAIT_SECONDS = Histogram("composition_lock_wait_seconds", "Time spent acquiring a lock.",
                              ["kind", "name"], buckets=_LOCK_BUCKETS)
LOCK_HOLD_SECONDS = Histogram("composition_lock_hold_seconds", "Time a lock was held (the with-block).",
                              ["kind", "name"], buckets=_LOCK_BUCKETS)
LOCK_FENCE_REJECTIONS = Counter("composition_lock_fence_rejections_total",
                                "Fenced writes refused because a newer fence was already seen.", ["name"])

# --- jobs (composition.jobs) -----------------------------------------------------------------------
# Labelled by actor (declared in code, so bounded); outcome is success, retry or dead.
__all__ += ["DEAD_LETTERS_TOTAL", "JOBS_IN_PROGRESS", "JOBS_TOTAL", "JOB_DURATION_SECONDS"]
JOBS_TOTAL = Counter("composition_jobs_total", "Job runs by outcome: success, retry, dead or expired (dropped unrun).",
                     ["actor", "outcome"])
__all__ += ["DEAD_LETTER_RECORD_OUTCOMES", "JOB_OUTCOMES"]
JOB_OUTCOMES = ("success", "retry", "dead", "expired")
DEAD_LETTER_RECORD_OUTCOMES = ("requeued", "broker_dlq")
JOB_DURATION_SECONDS = Histogram(
    "composition_job_duration_seconds", "Duration of one job run, whatever its outcome.", ["actor"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)
JOBS_IN_PROGRESS = Gauge("composition_jobs_in_progress", "Jobs running now.", ["actor"],
                         multiprocess_mode="livesum")
__all__ += ["JOB_TIMEOUTS_TOTAL"]
JOB_TIMEOUTS_TOTAL = Counter("composition_job_timeouts_total",
                             "Job runs interrupted by their time limit (timeout_s), by actor.", ["actor"])
DEAD_LETTERS_TOTAL = Counter("composition_dead_letters_total", "Messages dead-lettered, by actor.", ["actor"])
__all__ += ["JOB_LIMIT", "JOB_LIMIT_DELAYS_TOTAL", "JOB_LIMIT_SLOTS_HELD"]
JOB_LIMIT = Gauge(
    "composition_job_limit", "A job's declared limit across the cluster: kind=concurrency, runs at once; "
    "kind=rate, starts per second (the rate's starts divided by its window).", ["actor", "kind"],
    multiprocess_mode="livemax",
)
JOB_LIMIT_SLOTS_HELD = Gauge(
    "composition_job_limit_slots_held", "Concurrency slots of a job held in the whole cluster, as the worker "
    "processes sample them every METRICS_SAMPLE_INTERVAL_S.", ["actor"],
    multiprocess_mode="livemax",
)
JOB_LIMIT_DELAYS_TOTAL = Counter(
    "composition_job_limit_delays_total", "Starts put back to wait because a job was at its limit (kind: "
    "concurrency, rate, or unreachable when the limits' Redis could not be asked); not failures, not retries.",
    ["actor", "kind"],
)
__all__ += ["INCOMPATIBLE_MESSAGES_TOTAL"]
INCOMPATIBLE_MESSAGES_TOTAL = Counter(
    "composition_incompatible_messages_total", "Messages the running code could not run (job unknown here, "
    "another version, arguments that do not fit): waiting counts each put-back within DEPLOY_WINDOW_S, "
    "parked each message then dead-lettered as incompatible.", ["actor", "outcome"],
)
__all__ += ["DEAD_LETTER_RECORD_FAILURES_TOTAL"]
DEAD_LETTER_RECORD_FAILURES_TOTAL = Counter(
    "composition_dead_letter_record_failures_total",
    "Dead letters that could not be written after every retry, by actor and what became of the "
    "message: requeued (recorded at its next delivery) or broker_dlq (only in the broker's expiring DLQ).",
    ["actor", "outcome"])

# --- outbox (composition.outbox) ------------------------------------------------------------
__all__ += [
    "BROKER_LOSSES", "OUTBOX_OLDEST_PENDING_AGE_SECONDS", "OUTBOX_PENDING", "OUTBOX_RELAYED", "OUTBOX_RELAY_ERRORS",
    "OUTBOX_RELAY_LAG_SECONDS", "OUTBOX_RESENT",
]
OUTBOX_PENDING = Gauge("composition_outbox_pending_messages",
                       "Outbox messages not yet relayed (sampled by the relay sweeper and `outbox status`).",
                       multiprocess_mode="livemostrecent")
OUTBOX_OLDEST_PENDING_AGE_SECONDS = Gauge("composition_outbox_oldest_pending_age_seconds",
                                          "Age of the oldest outbox message not yet relayed (0 when none).",
                                          multiprocess_mode="livemostrecent")
BROKER_LOSSES = Counter("composition_broker_losses_total",
                        "Losses of the Redis broker's data detected (its epoch token gone): "
                        "composition.jobs.broker_losses.")
OUTBOX_RESENT = Counter("composition_outbox_resent_total",
                        "Outbox rows of idempotent jobs sent again after a loss of the broker's data (no ledger row, "
                        "no dead letter, past their redelivery window).", ["actor"])
OUTBOX_RELAYED = Counter("composition_outbox_relayed_total", "Outbox messages enqueued on the broker.",
                         ["actor"])
OUTBOX_RELAY_ERRORS = Counter("composition_outbox_relay_errors_total",
                              "Relay batches that failed to reach the broker (their claims are released).")
OUTBOX_RELAY_LAG_SECONDS = Histogram(
    "composition_outbox_relay_lag_seconds",
    "Time from publish to broker enqueue (commit to enqueue for short transactions).",
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)


# --- backpressure -------------------------------------------------------------------------------
QUEUE_DEPTH = Gauge(
    "composition_queue_depth_messages", "Backlog of a queue: pending outbox rows plus broker messages.", ["queue"],
    multiprocess_mode="livemax",
)
QUEUE_PAUSED = Gauge(
    "composition_queue_paused", "1 while a queue is paused (no job of it starts), as the worker processes "
    "last read it; 0 once resumed.", ["queue"],
    multiprocess_mode="livemax",
)
QUEUE_SHEDS_TOTAL = Counter(
    "composition_queue_sheds_total", "Non-essential queues paused by the shedding controller, by the signal over "
    "its limit (the first one, when several were).", ["queue", "signal"],
)
SHEDDING_PRESSURE_RATIO = Gauge(
    "composition_shedding_pressure_ratio", "Each shedding signal's last reading divided by its limit (1 or more: "
    "the non-essential queues are shed), as the worker processes measure it every SHED_INTERVAL_S.", ["signal"],
    multiprocess_mode="livemax",
)
BACKPRESSURE_REJECTIONS_TOTAL = Counter(
    "composition_backpressure_rejections_total", "Work refused because its queue was full.", ["queue"],
)
CIRCUIT_STATE = Gauge(
    "composition_circuit_state", "Circuit breaker state: 0 closed, 1 half-open, 2 open.", ["name"],
    multiprocess_mode="livemax",
)
CIRCUIT_REJECTIONS_TOTAL = Counter(
    "composition_circuit_rejections_total", "Calls refused by an open circuit.", ["name"],
)
__all__ += ["BACKPRESSURE_REJECTIONS_TOTAL", "CIRCUIT_REJECTIONS_TOTAL", "CIRCUIT_STATE", "QUEUE_DEPTH",
            "QUEUE_PAUSED", "QUEUE_SHEDS_TOTAL", "SHEDDING_PRESSURE_RATIO"]

# --- retention (composition.retention) ---------------------------------------------------------
# Labelled by database table (a handful, fixed by the models): the inbox ledger, sent outbox rows
# and resolved dead letters, whether pruned by runworkers on its schedule or by hand.
__all__ += ["RETENTION_PRUNED_TOTAL"]
RETENTION_PRUNED_TOTAL = Counter("composition_retention_pruned_total",
                                 "Rows deleted by retention pruning, by table.", ["table"])

# --- the catalogue's remainder: database, cache latency, broker, lock time-outs ----------------
# Sampled values (pg_stat_activity, pg_stat_database, the broker, open dead letters) describe the
# cluster, not the process that read them: every runworkers process samples the same numbers, so
# the merge keeps the most recent of the living processes.
__all__ += [
    "BROKER_MESSAGES", "BROKER_OLDEST_MESSAGE_AGE_SECONDS", "BROKER_READ_TIMESTAMP", "CACHE_INVALIDATIONS_PENDING",
    "CACHE_INVALIDATION_OLDEST_PENDING_AGE_SECONDS", "CACHE_OPERATION_SECONDS", "DB_CONNECTIONS_IN_USE",
    "DB_CONNECTIONS_MAX", "DB_CONNECTION_BUDGET", "DB_DEADLOCKS_DETECTED", "DB_SLOW_QUERIES_TOTAL",
    "DEAD_LETTERS_OPEN", "LOCK_LOST_TOTAL", "LOCK_TIMEOUTS_TOTAL", "SCHEDULER_CLOCK_SKEW_SECONDS",
    "SCHEDULE_LAG_SECONDS", "SCHEDULE_NEXT_FIRE_TIMESTAMP", "SCHEDULE_TICKS_TOTAL",
]
DB_CONNECTIONS_IN_USE = Gauge(
    "composition_db_connections_in_use",
    "Client connections open on the PostgreSQL server (every database), by state: active, idle, "
    "idle_in_transaction, other (pg_stat_activity, sampled by runworkers).", ["state"],
    multiprocess_mode="livemostrecent")
DB_CONNECTIONS_MAX = Gauge(
    "composition_db_connections_max",
    "Connections the server lets non-superusers open: max_connections less the reserved ones "
    "(sampled by runworkers); the ceiling the `manage.py system` budget must fit under.",
    multiprocess_mode="livemostrecent")
# Labelled by role (only "worker" so far), so that a process that never samples writes no 0 of its
# own into the sum.
DB_CONNECTION_BUDGET = Gauge(
    "composition_db_connection_budget",
    "Connections a process may hold by the `manage.py system` budget (its threads plus its "
    "background threads, or its pool's max_size), summed over the living processes of a role "
    "(worker: runworkers' processes).", ["role"],
    multiprocess_mode="livesum")
DB_DEADLOCKS_DETECTED = Gauge(
    "composition_db_deadlocks_detected",
    "Deadlocks PostgreSQL detected in this database since its statistics were last reset "
    "(pg_stat_database.deadlocks, sampled by runworkers: a cumulative count, use increase()).",
    multiprocess_mode="livemostrecent")
DB_SLOW_QUERIES_TOTAL = Counter(
    "composition_db_slow_queries_total",
    "Queries that took longer than COMPOSITION['DB_SLOW_QUERY_S'], by database alias.", ["alias"])
CACHE_OPERATION_SECONDS = Histogram(
    "composition_cache_operation_seconds",
    "Time of one cache_aside Redis round trip, by operation: get (the hit path's MGET), acquire "
    "(the rebuild lease), fill (store the rebuilt value); failed calls included.", ["operation"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0))
BROKER_MESSAGES = Gauge(
    "composition_broker_messages",
    "Messages the broker holds for a queue, by state: ready, delayed (retries and etas), in_flight "
    "(fetched, not acked; Redis only). Sampled by runworkers.", ["queue", "state"],
    multiprocess_mode="livemostrecent")
# Not moved while the broker cannot be read: the queue gauges keep their last reading then (a
# false 0 would clear the alerts), and this says how old that reading is. Live processes only: a
# dead one's last reading must not stand for the broker's.
BROKER_READ_TIMESTAMP = Gauge(
    "composition_broker_read_timestamp_seconds",
    "Unix time runworkers' sampler last read a queue's counts from the broker (or, before its first "
    "reading, started).", ["queue"],
    multiprocess_mode="livemax")
BROKER_OLDEST_MESSAGE_AGE_SECONDS = Gauge(
    "composition_broker_oldest_message_age_seconds",
    "How long the oldest ready message of a queue has been waiting (since it was created, or its "
    "eta); 0 when none. Redis broker only. Sampled by runworkers.", ["queue"],
    multiprocess_mode="livemostrecent")
CACHE_INVALIDATIONS_PENDING = Gauge(
    "composition_cache_invalidations_pending",
    "Cache invalidations recorded and not yet applied in Redis, by cache alias (sampled by runworkers).",
    ["alias"], multiprocess_mode="livemostrecent")
CACHE_INVALIDATION_OLDEST_PENDING_AGE_SECONDS = Gauge(
    "composition_cache_invalidation_oldest_pending_age_seconds",
    "How long the oldest pending cache invalidation has waited, by cache alias; 0 when none "
    "(sampled by runworkers).", ["alias"], multiprocess_mode="livemostrecent")
DEAD_LETTERS_OPEN = Gauge(
    "composition_dead_letters_open",
    "Dead letters neither replayed nor discarded, by actor (sampled by runworkers).", ["actor"],
    multiprocess_mode="livemostrecent")
LOCK_LOST_TOTAL = Counter(
    "composition_lock_lost_total",
    "Redis locks that expired before their with-block ended (the release found another owner or "
    "none), by kind and name: only the fence guarded the writes made after the expiry.",
    ["kind", "name"])
LOCK_TIMEOUTS_TOTAL = Counter(
    "composition_lock_timeouts_total",
    "Lock acquisitions that waited their whole timeout_s / wait_s and gave up, by kind and name "
    "(also counted as outcome busy in composition_lock_acquire_total; a refusal without a wait is not).",
    ["kind", "name"])
SCHEDULE_TICKS_TOTAL = Counter(
    "composition_schedule_ticks_total",
    "Ticks of each schedule by outcome: fired (on time), caught_up (a missed tick fired late, by "
    "the catch-up policy), missed (late and not caught up), skipped_overlap (held back by overlap "
    "or max_pending), paused (due while paused; never caught up), manual (schedules run).",
    ["schedule", "outcome"])
SCHEDULE_LAG_SECONDS = Histogram(
    "composition_schedule_lag_seconds",
    "From a tick's instant to its job's outbox row, by schedule (catch-ups included).", ["schedule"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0))
SCHEDULE_NEXT_FIRE_TIMESTAMP = Gauge(
    "composition_schedule_next_fire_timestamp_seconds",
    "When each schedule ticks next (Unix time), as its schedulers last computed it; kept after "
    "they stop, so an alert sees time() pass it when none is left.", ["schedule"],
    multiprocess_mode="max")
SCHEDULER_CLOCK_SKEW_SECONDS = Gauge(
    "composition_scheduler_clock_skew_seconds",
    "This host's clock minus the database's, as the scheduler last read both: ticks follow the "
    "database's clock, so skew does not move them, but it does move what this host logs.",
    multiprocess_mode="livemostrecent")
