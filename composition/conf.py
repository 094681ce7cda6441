"""One lazy accessor for ``settings.COMPOSITION``, and the two facts of the settings that the
library's parts check before use: the app is installed (``require_installed``), and the cache is
a django-redis one (``redis_client_of``).

Every key is optional; ``DEFAULTS`` documents each one. Values are read when first used, never
at import, and the merged view is dropped whenever Django's ``setting_changed`` fires, so
``override_settings`` works in tests.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings as django_settings
from django.core.signals import setting_changed

from composition.errors import ConfigurationError

__all__ = ["DEFAULTS", "conf", "redis_client_of", "require_installed"]

DEFAULTS: dict[str, Any] = {
    # Dramatiq broker: redis://, rediss:// or amqp://.
    "BROKER_URL": "redis://127.0.0.1:6379/0",
    # A dead Redis-broker worker's unacked messages return after this many seconds (Dramatiq's
    # own default is 60 s). Live workers beat every quarter of it; a worker process frozen for
    # longer (SIGSTOP, swapping) is taken for dead and its messages run again elsewhere.
    "BROKER_HEARTBEAT_TIMEOUT_S": 4.0,
    # Out of a million broker commands, how many run the Redis broker's maintenance step that
    # requeues dead workers' messages (Dramatiq's default is 1,000, i.e. 1 in 1,000).
    "BROKER_MAINTENANCE_CHANCE": 100_000,
    # Every Redis-broker call is bounded by these, so a frozen broker costs seconds, not forever;
    # the socket timeout also bounds the wait for RabbitMQ's confirms of one relay batch.
    "BROKER_SOCKET_TIMEOUT_S": 2.0,
    "BROKER_CONNECT_TIMEOUT_S": 1.0,
    # RabbitMQ only: declare every queue with x-max-priority of this many levels (1 to 255; 10 is
    # RabbitMQ's advice), so messages with a priority (django.tasks) are delivered higher first.
    # A queue argument: RabbitMQ refuses to change it on a queue that exists (docs/tasks.md). None:
    # queues without priorities, and django.tasks priorities other than 0 are refused.
    "RABBITMQ_MAX_PRIORITY": None,
    # RabbitMQ only: "quorum" declares the queues (work, delay and dead) as quorum queues,
    # replicated over a cluster's nodes, instead of Dramatiq's classic ones; a queue that exists as
    # the other type is refused with what to do (docs/deployment.md, 'RabbitMQ quorum queues').
    "RABBITMQ_QUEUE_TYPE": "classic",
    # Quorum work queues: a message returned this many times (its worker died with it each time)
    # goes to the queue's dead queue (.XQ). A pause's hand-back does not count: it is a copy.
    "RABBITMQ_DELIVERY_LIMIT": 20,
    # The DATABASES aliases behind a transaction pooler (PgBouncer pool_mode=transaction): nothing
    # is set per session there (the timeouts below are the role's: docs/deployment.md), and
    # `manage.py check` requires what such a pooler needs (checks E150-E153, E155, W154).
    "TRANSACTION_POOLED_DATABASES": [],
    # Connection settings applied to every new PostgreSQL connection (the role's, behind a pooler).
    "DB_STATEMENT_TIMEOUT_S": 30.0,
    "DB_IDLE_IN_TRANSACTION_TIMEOUT_S": 60.0,
    # A query that takes longer than this is counted in composition_db_slow_queries_total and
    # logged (its SQL, never its parameters). None: not measured.
    "DB_SLOW_QUERY_S": 1.0,
    # Readiness: all dependencies are probed concurrently under one deadline, and the answer
    # is reused for HEALTH_CACHE_S so a busy load balancer does not become load.
    "HEALTH_DEADLINE_S": 2.0,
    "HEALTH_CACHE_S": 1.0,
    # Per role, "critical" fails readiness when down, "degraded" is reported but stays ready,
    # "ignore" is not probed. Web (/readyz) needs only PostgreSQL: publishing writes the outbox,
    # and the relay sends once the broker is back. Workers (`health readiness --role worker`)
    # need their broker.
    "HEALTH_DEPENDENCIES": {"database": "critical", "cache": "degraded", "broker": "degraded"},
    "HEALTH_WORKER_DEPENDENCIES": {"database": "critical", "cache": "degraded", "broker": "critical"},
    # The host-wide draining marker written by `manage.py drain` (the pre-stop step): while it
    # exists, readiness answers 503 "draining" in every process of the host. None: off.
    "HEALTH_DRAIN_FILE": None,
    # How long `manage.py drain` waits after marking, for load balancers to stop sending work.
    "HEALTH_DRAIN_WAIT_S": 5.0,
    # The cache alias that composition uses (django-redis backend).
    "CACHE_ALIAS": "default",
    # cache_aside: dotted path of the serializer class (dumps -> bytes, loads); JSON by default so
    # nothing read back from Redis is ever unpickled.
    "CACHE_SERIALIZER": "composition.cache.serializers.JSONSerializer",
    # A rebuild lease expires after this long, so a crashed rebuilder blocks nobody for longer.
    "CACHE_LEASE_TTL_S": 10.0,
    # Callers that lose the rebuild lease wait this long for the winner's value, then load it
    # themselves (without caching it). As long as the lease by default: with a shorter wait, a
    # rebuild slower than it (a database under load) had every waiter load for itself, a stampede
    # exactly when the database can least take one.
    "CACHE_LEASE_WAIT_S": 10.0,
    # Consecutive Redis failures that open the cache's circuit breaker, and how long it stays
    # open before one background probe (which replays deferred invalidations) may close it.
    "CACHE_BREAKER_FAILURES": 3,
    "CACHE_BREAKER_RESET_S": 1.0,
    # InvalidationReplayComponent replays invalidations deferred during a Redis outage this often.
    "CACHE_REPLAY_INTERVAL_S": 5.0,
    # Outbox: publish() refuses a payload whose JSON encoding is larger than this (payloads are
    # meant to carry ids, not data).
    "OUTBOX_MAX_PAYLOAD_BYTES": 8192,
    # The relay claims and enqueues up to this many messages per batch (one claim transaction,
    # one batched broker call, one update).
    "OUTBOX_BATCH_SIZE": 500,
    # A relay's claim expires after this long; a crashed relay's rows are then claimed again
    # (within this plus one sweep interval). Keep it well above the time one batch takes (a batch
    # is bounded by the broker's socket timeout), or a slow relay's rows are sent twice.
    "OUTBOX_LEASE_S": 4.0,
    # Redis broker: how often runworkers looks for a loss of the broker's data (its epoch token
    # gone: a restart without persistence, a flush, a failover to an empty replica), and how far
    # back a loss reconciles idempotent jobs from the ledger (within INBOX_RETENTION_S,
    # DEAD_LETTER_RETENTION_S and OUTBOX_RETENTION_S, check E023): docs/jobs.md, 'When the broker
    # loses messages'.
    "BROKER_LOSS_CHECK_INTERVAL_S": 5.0,
    "BROKER_LOSS_LOOKBACK_S": 86_400.0,
    # A publish delayed longer than this waits in the outbox, held until due, not in the broker
    # (RabbitMQ closes a consumer that holds a message unacknowledged past its consumer_timeout,
    # 30 min by default; Redis keeps it in memory): docs/jobs.md, 'Long delays'.
    "OUTBOX_HELD_DELAY_S": 900.0,
    # runworkers sweeps the outbox this often for messages whose after-commit nudge was lost,
    # and for held messages that came due.
    "OUTBOX_SWEEP_INTERVAL_S": 1.0,
    # One relay nudge relays for at most this long (plus the batch under way), then gives its
    # worker thread back and hands the rest to a fresh nudge. Keep it well below the relay's
    # time limit: time limits never cut a batch, they only end a round between batches.
    "OUTBOX_RELAY_BUDGET_S": 5.0,
    "OUTBOX_RELAY_TIME_LIMIT_S": 120.0,
    # runworkers
    "WORKER_PROCESSES": 1,
    "WORKER_THREADS": 8,
    "WORKER_QUEUES": None,
    # An idle consumer polls at this interval (Dramatiq's default is 1,000 ms).
    "WORKER_IDLE_POLL_MS": 100,
    "SHUTDOWN_TIMEOUT_S": 30.0,
    # A worker process writes a heartbeat this often; a heartbeat older than
    # WORKER_STALE_AFTER_S counts as a dead or stuck process.
    "WORKER_HEARTBEAT_S": 5.0,
    "WORKER_STALE_AFTER_S": 30.0,
    # A worker holding one job longer than this (for a job without its own time limit) is stuck.
    "WORKER_STUCK_AFTER_S": 600.0,
    # Job limits (docs/limits.md): a concurrency slot is a lease on the cache's Redis that its
    # worker process renews every third of LIMIT_SLOT_TTL_S while the job runs; a SIGKILLed
    # worker's slots come back within it. A job over a limit goes back to its queue's delay
    # queue for at most LIMIT_MAX_DELAY_S at a time (its turn in the limit's waiting line).
    "LIMIT_SLOT_TTL_S": 15.0,
    "LIMIT_MAX_DELAY_S": 30.0,
    # A message the running code cannot run (its job unknown here, a newer version, arguments
    # that do not fit) goes back to wait this long, for the rest of a rolling deploy to reach
    # its worker, before it is parked as a dead letter (docs/deployment.md); 0: parked at once.
    "DEPLOY_WINDOW_S": 300.0,
    # A django.tasks task's return value is kept with its result up to this size (JSON, encoded);
    # a larger one, or one that is not JSON, fails the run (composition.tasks).
    "TASK_RETURN_VALUE_MAX_BYTES": 65536,
    # Every worker process reads which queues are paused (`manage.py queues pause`) this often:
    # no job of a queue starts later than this (and one query) after its pause returns.
    "QUEUE_PAUSE_REFRESH_S": 0.5,
    # The operations page charts each queue over its last 60 buckets of this many seconds (an
    # hour): the depth, runs ended and failed, pauses; runworkers adds to them as it samples.
    "QUEUE_HISTORY_BUCKET_S": 60.0,
    # runworkers serves Prometheus /metrics on this port (None: off; `--metrics-port` overrides),
    # bound to WORKER_METRICS_ADDRESS. With PROMETHEUS_MULTIPROC_DIR set it serves the whole
    # directory: every process of the host (or container) that writes there.
    "WORKER_METRICS_PORT": None,
    "WORKER_METRICS_ADDRESS": "0.0.0.0",
    # Who may scrape /metrics (the web view and runworkers' server alike): a request must carry
    # `Authorization: Bearer <METRICS_TOKEN>` (None: no token needed; else 401) and come from an
    # address in METRICS_ALLOWED_NETWORKS, a list of CIDRs (None: any address; else 403).
    "METRICS_TOKEN": None,
    "METRICS_ALLOWED_NETWORKS": None,
    # runworkers samples what no single call can count this often: connections in use and
    # deadlocks (pg_stat_activity, pg_stat_database), each queue's depth and oldest message,
    # open dead letters per actor. One round of a few cheap queries per worker process.
    "METRICS_SAMPLE_INTERVAL_S": 15.0,
    # Backpressure: queue name -> the backlog (pending outbox rows + broker messages) at which
    # admit() refuses new work; path prefix -> queue, for BackpressureMiddleware's unsafe requests.
    "BACKPRESSURE_QUEUES": {},
    "BACKPRESSURE_PATHS": {},
    # How often a process re-measures a queue's depth, and what Retry-After tells callers.
    "BACKPRESSURE_CACHE_S": 0.5,
    "BACKPRESSURE_RETRY_AFTER_S": 5.0,
    # Shedding (docs/backpressure.md): the non-essential queues in SHED_QUEUES pause on their own
    # while a pressure signal of SHED_WHEN is at or over its limit (a limit of None turns that
    # signal off), and resume once every signal has stayed below SHED_RESUME_BELOW of its limit
    # for SHED_RESUME_AFTER_S. While shed, admit() refuses them. The pressure is that of
    # SHED_ESSENTIAL_QUEUES (None: every declared queue but the shed ones and the relay's),
    # measured by each runworkers process every SHED_INTERVAL_S. The signals: oldest_wait_s, the
    # oldest ready message's wait (Redis only); ready_messages, messages ready on the broker
    # (both brokers: RabbitMQ's signal); db_latency_ms, a trivial query's round trip.
    "SHED_QUEUES": [],
    "SHED_ESSENTIAL_QUEUES": None,
    "SHED_WHEN": {"oldest_wait_s": 30.0, "ready_messages": None, "db_latency_ms": None},
    "SHED_RESUME_BELOW": 0.5,
    "SHED_RESUME_AFTER_S": 10.0,
    "SHED_INTERVAL_S": 0.5,
    # Retention: runworkers prunes old rows this often (one process of the cluster at a time,
    # RETENTION_BATCH_SIZE rows per short transaction). Each *_RETENTION_S may be None: keep forever.
    "RETENTION_INTERVAL_S": 3600.0,
    "RETENTION_BATCH_SIZE": 1000,
    # Inbox ledger rows (ProcessedMessage) older than this go. It is never cut below the longest
    # redelivery window of a declared job (its retry schedule plus BROKER_HEARTBEAT_TIMEOUT_S plus
    # OUTBOX_LEASE_S), or a late redelivery would find no row and run its effects twice.
    "INBOX_RETENTION_S": 7 * 86_400.0,
    # Sent outbox rows older than this (by sent_at) go; pending rows are never pruned.
    "OUTBOX_RETENTION_S": 7 * 86_400.0,
    # Replayed or discarded dead letters older than this (by replayed_at / discarded_at) go;
    # unresolved ("dead") ones are never pruned. Long enough for post-mortems.
    "DEAD_LETTER_RETENTION_S": 30 * 86_400.0,
    # Fired schedule ticks (ScheduleTick) older than this go, once their run ended or its lease
    # did. A schedule's watermark, not its old ticks, keeps a tick from firing twice.
    "SCHEDULE_TICK_RETENTION_S": 7 * 86_400.0,
    # Queue history buckets (the operations page's charts) older than this go.
    "QUEUE_HISTORY_RETENTION_S": 86_400.0,
    # django.tasks results (TaskRecord) finished longer ago than this (by finished_at) go, with
    # their return values; one that failed stays while its dead letter is unresolved. After that,
    # get_result raises TaskResultDoesNotExist.
    "TASK_RESULT_RETENTION_S": 7 * 86_400.0,
    # Deprecated, read by nothing (check W003 says so when set): logging is Django's LOGGING,
    # e.g. composition.logging.logging_config("json", "INFO"). Still known keys, so settings
    # that have them do not fail with E002 (unknown key).
    "LOG_FORMAT": None,
    "LOG_LEVEL": None,
}


class _Conf:
    """Attribute access to the merged settings: ``conf.BROKER_URL``."""

    def __init__(self) -> None:
        self._merged: dict[str, Any] | None = None

    def _load(self) -> dict[str, Any]:
        if self._merged is None:
            user = getattr(django_settings, "COMPOSITION", None) or {}
            merged = dict(DEFAULTS)
            if isinstance(user, dict):
                merged.update(user)
            self._merged = merged
        return self._merged

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        merged = self._load()
        try:
            value = merged[name]
        except KeyError:
            raise AttributeError(f"unknown COMPOSITION setting {name!r}") from None
        # Kept as an instance attribute, so the next read is a plain attribute lookup that never
        # reaches __getattr__ (hot paths read settings per request); reload() drops them all.
        self.__dict__[name] = value
        return value

    def as_dict(self) -> dict[str, Any]:
        return dict(self._load())

    def reload(self) -> None:
        self.__dict__.clear()
        self._merged = None


conf = _Conf()


def redis_client_of(alias: str, what: str) -> Any:
    """The Redis client of the django-redis cache ``alias``, which ``what`` needs; raises
    ConfigurationError for another backend (Django's own RedisCache has no such client, and
    each use failed on an AttributeError)."""
    from django.core.cache import caches

    cache: Any = caches[alias]
    try:
        return cache.client.get_client(write=True)
    except AttributeError:
        backend = django_settings.CACHES.get(alias, {}).get("BACKEND")
        raise ConfigurationError(f"{what} needs a django-redis cache: CACHES[{alias!r}]['BACKEND'] is {backend!r}, "
                                   "not 'django_redis.cache.RedisCache'") from None


def require_installed(what: str) -> None:
    """Raise ConfigurationError (an ImproperlyConfigured) when the ``composition`` app is not in
    INSTALLED_APPS: without it ``what`` would seem to work (no check runs, no migration is applied,
    no worker command exists) until a query met a table that is not there."""
    if apps.apps_ready and not apps.is_installed("composition"):
        raise ConfigurationError(f'{what} needs "composition" in INSTALLED_APPS (docs/install.md), then '
                                 "python manage.py migrate")


def _on_setting_changed(*, setting: str, **_: Any) -> None:
    if setting == "COMPOSITION":
        conf.reload()


setting_changed.connect(_on_setting_changed)
