"""System checks for COMPOSITION mistakes, reported by ``manage.py check``."""

from __future__ import annotations

import math
from os import PathLike
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DEFAULT_DB_ALIAS

from composition.broker.configured import broker_kind
from composition.broker.rabbitmq_queues import check_rabbitmq_queue_settings
from composition.cache.serializers import load_serializer
from composition.conf import DEFAULTS, conf
from composition.db.pooling import check_pooled_settings, check_pooled_timeouts
from composition.errors import BrokerConfigurationError
from composition.jobs.queue_order import QueueOrder
from composition.prometheus.access import parse_networks
from composition.prometheus.errors import MetricsAccessConfigurationError
from composition.retention import longest_redelivery_window

POSITIVE_NUMBERS = (
    "BROKER_HEARTBEAT_TIMEOUT_S", "BROKER_SOCKET_TIMEOUT_S", "BROKER_CONNECT_TIMEOUT_S",
    "DB_STATEMENT_TIMEOUT_S", "DB_IDLE_IN_TRANSACTION_TIMEOUT_S",
    "HEALTH_DEADLINE_S", "HEALTH_CACHE_S", "SHUTDOWN_TIMEOUT_S", "WORKER_HEARTBEAT_S",
    "WORKER_STALE_AFTER_S", "WORKER_STUCK_AFTER_S", "LIMIT_SLOT_TTL_S", "LIMIT_MAX_DELAY_S",
)
POSITIVE_INTEGERS = ("WORKER_PROCESSES", "WORKER_THREADS", "WORKER_IDLE_POLL_MS", "TASK_RETURN_VALUE_MAX_BYTES")
DEPENDENCY_LEVELS = ("critical", "degraded", "ignore")
DEPENDENCIES = ("database", "cache", "broker")


DEPRECATED_KEYS = ("LOG_FORMAT", "LOG_LEVEL")


def _not_postgresql() -> list[CheckMessage]:
    """composition needs PostgreSQL: the outbox claims rows with SKIP LOCKED, and retention and
    the relay take advisory locks."""
    from django.db import connections

    if "default" not in connections.settings:
        return []
    vendor = connections["default"].vendor
    if vendor == "postgresql":
        return []
    return [Error(f"composition needs PostgreSQL as the default database; it is {vendor}.",
                  hint="Use django.db.backends.postgresql (or a backend built on it, such as "
                       "django_prometheus.db.backends.postgresql): the outbox claims rows with "
                       "SELECT ... FOR UPDATE SKIP LOCKED and the workers take advisory locks.",
                  id="composition.E011")]


def _merged() -> dict[str, Any] | None:
    """COMPOSITION over the defaults, or None when it is not a dict (reported as E001)."""
    user = getattr(settings, "COMPOSITION", {})
    return {**DEFAULTS, **user} if isinstance(user, dict) else None


def _not_positive_seconds(merged: dict[str, Any], keys: tuple[str, ...], check_id: str) -> list[CheckMessage]:
    return [Error(f"COMPOSITION[{key!r}] must be a positive number of seconds, got {merged[key]!r}.", id=check_id)
            for key in keys
            if isinstance(merged[key], bool) or not isinstance(merged[key], int | float) or merged[key] <= 0]


def _not_positive_integers(merged: dict[str, Any], keys: tuple[str, ...], check_id: str) -> list[CheckMessage]:
    return [Error(f"COMPOSITION[{key!r}] must be a positive integer, got {merged[key]!r}.", id=check_id)
            for key in keys
            if isinstance(merged[key], bool) or not isinstance(merged[key], int) or merged[key] < 1]


@register("composition")
def check_settings(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    user = getattr(settings, "COMPOSITION", {})
    if not isinstance(user, dict):
        return [Error("COMPOSITION must be a dict.", id="composition.E001")]
    merged = {**DEFAULTS, **user}
    messages: list[CheckMessage] = []
    for key in sorted(set(user) - set(DEFAULTS)):
        messages.append(Error(f"COMPOSITION has unknown key {key!r}.",
                              hint="See composition.conf.DEFAULTS for the keys.", id="composition.E002"))
    try:
        broker_kind(str(merged["BROKER_URL"]))
    except Exception as exc:
        messages.append(Error(str(exc), id="composition.E003"))
    messages += _not_positive_seconds(merged, POSITIVE_NUMBERS, "composition.E004")
    messages += _not_positive_integers(merged, POSITIVE_INTEGERS, "composition.E005")
    for key in ("HEALTH_DEPENDENCIES", "HEALTH_WORKER_DEPENDENCIES"):
        levels = merged[key]
        if not isinstance(levels, dict) or any(v not in DEPENDENCY_LEVELS for v in levels.values()):
            messages.append(Error(f"COMPOSITION[{key!r}] values must be one of {DEPENDENCY_LEVELS}.",
                                  id="composition.E006"))
        elif unknown := sorted(set(levels) - set(DEPENDENCIES)):
            messages.append(Error(f"COMPOSITION[{key!r}] names unknown dependencies {unknown}; "
                                  f"expected some of {DEPENDENCIES}.", id="composition.E006"))
    for key in ("HEALTH_DRAIN_WAIT_S", "DEPLOY_WINDOW_S"):
        wait_s = merged[key]
        if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or wait_s < 0:
            messages.append(Error(f"COMPOSITION[{key!r}] must be a number of seconds >= 0, got {wait_s!r}.",
                                  id="composition.E009"))
    if merged["HEALTH_DRAIN_FILE"] is not None and not isinstance(merged["HEALTH_DRAIN_FILE"], str | PathLike):
        messages.append(Error("COMPOSITION['HEALTH_DRAIN_FILE'] must be a path or None.", id="composition.E010"))
    if merged["WORKER_QUEUES"] is not None:
        try:
            QueueOrder.parse(merged["WORKER_QUEUES"])
        except ValueError as exc:
            messages.append(Error(f"COMPOSITION['WORKER_QUEUES']: {exc}", id="composition.E012"))
    max_priority = merged["RABBITMQ_MAX_PRIORITY"]
    if max_priority is not None and (isinstance(max_priority, bool) or not isinstance(max_priority, int)
                                     or not 1 <= max_priority <= 255):
        messages.append(Error(f"COMPOSITION['RABBITMQ_MAX_PRIORITY'] must be None or an int from 1 to 255 "
                              f"(RabbitMQ's x-max-priority), got {max_priority!r}.", id="composition.E013"))
    messages += check_rabbitmq_queue_settings(merged)
    alias = merged["CACHE_ALIAS"]
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        messages.append(Error(f"COMPOSITION['CACHE_ALIAS'] names {alias!r}, which is not in CACHES.",
                              id="composition.E007"))
    elif "django_redis" not in str(caches[alias].get("BACKEND", "")):
        messages.append(Warning(f"CACHES[{alias!r}] is not a django-redis cache; cache-aside and "
                                "redis locks need one.", id="composition.W001"))
    for key in DEPRECATED_KEYS:
        if user.get(key) is not None:
            messages.append(Warning(
                f"COMPOSITION[{key!r}] is deprecated and does nothing.",
                hint="Configure logging with Django's LOGGING setting: "
                     "LOGGING = composition.logging.logging_config('json', 'INFO').", id="composition.W003"))
    messages += _not_postgresql()
    if not messages and merged["WORKER_STALE_AFTER_S"] <= merged["WORKER_HEARTBEAT_S"]:
        messages.append(Warning("WORKER_STALE_AFTER_S should be several WORKER_HEARTBEAT_S, or live "
                                "workers look dead.", id="composition.W002"))
    return messages


# --- cache-aside and locks -------------------------------------------------------------------
CACHE_POSITIVE_NUMBERS = ("CACHE_LEASE_TTL_S", "CACHE_LEASE_WAIT_S", "CACHE_BREAKER_RESET_S",
                          "CACHE_REPLAY_INTERVAL_S")


@register("composition")
def check_cache_settings(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    merged = _merged()
    if merged is None:
        return []
    messages = _not_positive_seconds(merged, CACHE_POSITIVE_NUMBERS, "composition.E040")
    messages += _not_positive_integers(merged, ("CACHE_BREAKER_FAILURES",), "composition.E041")
    try:
        load_serializer(merged["CACHE_SERIALIZER"])
    except Exception as exc:
        messages.append(Error(str(exc), id="composition.E042"))
    cache = getattr(settings, "CACHES", {}).get(merged["CACHE_ALIAS"], {})
    options = cache.get("OPTIONS") or {}
    if "django_redis" in str(cache.get("BACKEND", "")) and not (
            options.get("SOCKET_TIMEOUT") and options.get("SOCKET_CONNECT_TIMEOUT")):
        messages.append(Warning(
            f"CACHES[{merged['CACHE_ALIAS']!r}] has no SOCKET_TIMEOUT / SOCKET_CONNECT_TIMEOUT: a dead or "
            "frozen Redis then blocks cache_aside and redis_lock callers indefinitely.",
            hint="Set both to a fraction of a second (the example project uses 0.25).",
            id="composition.W041"))
    return messages


# --- outbox ------------------------------------------------------------------------------------
OUTBOX_POSITIVE_NUMBERS = ("OUTBOX_LEASE_S", "OUTBOX_SWEEP_INTERVAL_S", "OUTBOX_RELAY_BUDGET_S",
                           "OUTBOX_RELAY_TIME_LIMIT_S", "OUTBOX_HELD_DELAY_S", "BROKER_LOSS_CHECK_INTERVAL_S",
                           "BROKER_LOSS_LOOKBACK_S")
OUTBOX_POSITIVE_INTEGERS = ("OUTBOX_MAX_PAYLOAD_BYTES", "OUTBOX_BATCH_SIZE")


@register("composition")
def check_outbox_settings(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    merged = _merged()
    if merged is None:
        return []
    messages = _not_positive_seconds(merged, OUTBOX_POSITIVE_NUMBERS, "composition.E020")
    messages += _not_positive_integers(merged, OUTBOX_POSITIVE_INTEGERS, "composition.E021")
    if not messages and merged["OUTBOX_LEASE_S"] <= merged["OUTBOX_SWEEP_INTERVAL_S"]:
        messages.append(Warning("OUTBOX_LEASE_S should be several OUTBOX_SWEEP_INTERVAL_S, or relays take "
                                "each other's rows and send them twice.", id="composition.W020"))
    if not messages and merged["OUTBOX_RELAY_BUDGET_S"] * 2 > merged["OUTBOX_RELAY_TIME_LIMIT_S"]:
        messages.append(Warning(
            "OUTBOX_RELAY_BUDGET_S should be well below OUTBOX_RELAY_TIME_LIMIT_S (at most half): a relay "
            "round that outlasts its time limit is interrupted between batches and its worker looks stuck.",
            id="composition.W021"))
    if not any(message.is_serious() for message in messages):
        messages += _lookback_beyond_retention(merged)
        messages += _retries_longer_than_held_delay(float(merged["OUTBOX_HELD_DELAY_S"]))
    return messages


def _lookback_beyond_retention(merged: dict[str, Any]) -> list[CheckMessage]:
    """A broker loss's look-back must stay within what the ledger and the dead letters keep: a
    job whose ledger row was pruned looks as if it never ran, and would run again."""
    lookback_s = float(merged["BROKER_LOSS_LOOKBACK_S"])
    return [Error(f"COMPOSITION['BROKER_LOSS_LOOKBACK_S'] ({lookback_s:g} s) is longer than {key} "
                  f"({float(merged[key]):g} s): after a broker loss, jobs whose records were pruned would run again.",
                  hint=f"Lower BROKER_LOSS_LOOKBACK_S to {key} or less.", id="composition.E023")
            for key in ("INBOX_RETENTION_S", "DEAD_LETTER_RETENTION_S")
            if isinstance(merged[key], int | float) and not isinstance(merged[key], bool) and lookback_s > merged[key]]


def _retries_longer_than_held_delay(held_delay_s: float) -> list[CheckMessage]:
    """A job whose retries wait longer than ``OUTBOX_HELD_DELAY_S``: a retry is no publish, it
    waits on the broker (a RabbitMQ consumer holds it, Redis keeps it in memory)."""
    from composition.broker.configured import configured_broker

    try:
        actors = configured_broker().actors
    except Exception:  # settings the broker cannot be built from: their own checks report them
        return []
    policies = {name: actor.options["job_policy"] for name, actor in actors.items() if "job_policy" in actor.options}
    return [Warning(f"job {name!r} retries up to {policy.max_delay_s:g} s later, longer than OUTBOX_HELD_DELAY_S "
                    f"({held_delay_s:g} s): its retries wait on the broker, not in the outbox.",
                    hint="Lower its max_delay_s, or raise OUTBOX_HELD_DELAY_S within the broker's limits (RabbitMQ's "
                         "consumer_timeout); docs/jobs.md, 'Long delays'.", id="composition.W022")
            for name, policy in sorted(policies.items()) if policy.max_delay_s > held_delay_s]


# --- backpressure -------------------------------------------------------------------------------
@register("composition")
def check_backpressure_settings(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    merged = _merged()
    if merged is None:
        return []
    messages = _not_positive_seconds(merged, ("BACKPRESSURE_CACHE_S", "BACKPRESSURE_RETRY_AFTER_S"),
                                     "composition.E050")
    queues = merged["BACKPRESSURE_QUEUES"]
    if not isinstance(queues, dict) or any(
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 1 for limit in queues.values()):
        messages.append(Error("COMPOSITION['BACKPRESSURE_QUEUES'] must map queue names to positive integers.",
                              id="composition.E051"))
    paths = merged["BACKPRESSURE_PATHS"]
    if not isinstance(paths, dict) or any(
            not str(prefix).startswith("/") or not isinstance(queue, str) for prefix, queue in paths.items()):
        messages.append(Error("COMPOSITION['BACKPRESSURE_PATHS'] must map path prefixes ('/...') to queue names.",
                              id="composition.E052"))
    elif isinstance(queues, dict):
        for prefix, queue in sorted(paths.items()):
            if queue not in queues:
                messages.append(Warning(f"BACKPRESSURE_PATHS[{prefix!r}] names queue {queue!r}, which has no limit "
                                        "in BACKPRESSURE_QUEUES: it is never refused.", id="composition.W050"))
    return messages


# --- shedding -----------------------------------------------------------------------------------
@register("composition")
def check_shedding_settings(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    merged = _merged()
    if merged is None:
        return []
    messages = _not_positive_seconds(merged, ("SHED_INTERVAL_S", "QUEUE_PAUSE_REFRESH_S", "QUEUE_HISTORY_BUCKET_S"),
                                     "composition.E130")
    after = merged["SHED_RESUME_AFTER_S"]
    if isinstance(after, bool) or not isinstance(after, int | float) or after < 0:
        messages.append(Error(f"COMPOSITION['SHED_RESUME_AFTER_S'] must be a number of seconds >= 0, got {after!r}.",
                              id="composition.E130"))
    below = merged["SHED_RESUME_BELOW"]
    if isinstance(below, bool) or not isinstance(below, int | float) or not 0 < below <= 1:
        messages.append(Error(f"COMPOSITION['SHED_RESUME_BELOW'] must be a share of the limits, above 0 and at "
                              f"most 1, got {below!r}.", hint="0.5: resume once every signal is below half its limit.",
                              id="composition.E131"))
    shed, essential = merged["SHED_QUEUES"], merged["SHED_ESSENTIAL_QUEUES"]
    if not isinstance(shed, list | tuple) or not all(isinstance(queue, str) for queue in shed):
        messages.append(Error("COMPOSITION['SHED_QUEUES'] must be a list of queue names.", id="composition.E132"))
        shed = []
    if essential is not None and (not isinstance(essential, list | tuple)
                                  or not all(isinstance(queue, str) for queue in essential)):
        messages.append(Error("COMPOSITION['SHED_ESSENTIAL_QUEUES'] must be a list of queue names or None.",
                              id="composition.E132"))
        essential = None
    from composition.outbox.relay import RELAY_QUEUE_NAME
    from composition.queues.pressure import SIGNALS

    if RELAY_QUEUE_NAME in shed:
        messages.append(Error(f"COMPOSITION['SHED_QUEUES'] names {RELAY_QUEUE_NAME!r}, the outbox relay's queue: "
                              "shedding it would stop every queue's jobs.", id="composition.E132"))
    if essential and set(shed) & set(essential):
        messages.append(Error(f"COMPOSITION: {sorted(set(shed) & set(essential))} are in both SHED_QUEUES and "
                              "SHED_ESSENTIAL_QUEUES: a queue cannot shed itself.", id="composition.E132"))
    when = merged["SHED_WHEN"]
    if not isinstance(when, dict) or any(signal not in SIGNALS for signal in when) or any(
            limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | float) or limit <= 0)
            for limit in when.values()):
        messages.append(Error(f"COMPOSITION['SHED_WHEN'] must map signals of {list(SIGNALS)} to positive limits "
                              "(or None: that signal off).", id="composition.E133"))
    elif shed:
        measurable = {signal for signal, limit in when.items() if limit is not None}
        if str(merged["BROKER_URL"]).startswith("amqp"):
            measurable.discard("oldest_wait_s")
        if not measurable:
            messages.append(Warning(
                "COMPOSITION['SHED_QUEUES'] is set but no signal of SHED_WHEN can be measured on this broker: "
                "nothing is ever shed.",
                hint="On RabbitMQ a queue's oldest message cannot be timed without consuming it: set "
                     "SHED_WHEN['ready_messages'] (and/or 'db_latency_ms').", id="composition.W134"))
    return messages


# --- retention ----------------------------------------------------------------------------------
RETENTION_PERIODS = ("INBOX_RETENTION_S", "OUTBOX_RETENTION_S", "DEAD_LETTER_RETENTION_S", "SCHEDULE_TICK_RETENTION_S",
                     "QUEUE_HISTORY_RETENTION_S", "TASK_RESULT_RETENTION_S")


@register("composition")
def check_retention_settings(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    merged = _merged()
    if merged is None:
        return []
    # None is allowed for a period: that table is kept forever.
    periods = tuple(key for key in RETENTION_PERIODS if merged[key] is not None)
    messages = _not_positive_seconds(merged, ("RETENTION_INTERVAL_S", *periods), "composition.E060")
    messages += _not_positive_integers(merged, ("RETENTION_BATCH_SIZE",), "composition.E061")
    inbox_s = merged["INBOX_RETENTION_S"]
    # The window is built from these two; E004 and E020 report them when they are wrong.
    window_inputs = ("BROKER_HEARTBEAT_TIMEOUT_S", "OUTBOX_LEASE_S")
    if messages or inbox_s is None or _not_positive_seconds(merged, window_inputs, "composition.E004"):
        return messages
    try:
        longest = longest_redelivery_window()
    except BrokerConfigurationError:  # reported as E003
        return messages
    if longest is not None and inbox_s < longest[1]:
        actor, window_s = longest
        messages.append(Warning(
            f"COMPOSITION['INBOX_RETENTION_S'] is {inbox_s:g} s, shorter than the redelivery window of job "
            f"{actor!r} ({window_s:g} s: its retry schedule, BROKER_HEARTBEAT_TIMEOUT_S and OUTBOX_LEASE_S); "
            "ledger rows are kept for the window instead.",
            hint=f"Set INBOX_RETENTION_S to at least {math.ceil(window_s)}, or shorten the job's retries.",
            id="composition.W060"))
    return messages


# --- metrics ----------------------------------------------------------------------------------
@register("composition")
def check_metrics_settings(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    merged = _merged()
    if merged is None:
        return []
    messages: list[CheckMessage] = []
    port = merged["WORKER_METRICS_PORT"]
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        messages.append(Error(f"COMPOSITION['WORKER_METRICS_PORT'] must be a TCP port (1-65535) or None, "
                              f"got {port!r}.", id="composition.E070"))
    if not isinstance(merged["WORKER_METRICS_ADDRESS"], str):
        messages.append(Error("COMPOSITION['WORKER_METRICS_ADDRESS'] must be an address string.",
                              id="composition.E070"))
    token = merged["METRICS_TOKEN"]
    if token is not None and (not isinstance(token, str) or not token):
        messages.append(Error("COMPOSITION['METRICS_TOKEN'] must be a non-empty string or None.",
                              id="composition.E071"))
    try:
        parse_networks(merged["METRICS_ALLOWED_NETWORKS"])
    except MetricsAccessConfigurationError as exc:
        messages.append(Error(str(exc), hint="For example ['10.0.0.0/8', '127.0.0.1/32'].", id="composition.E072"))
    messages += _not_positive_seconds(merged, ("METRICS_SAMPLE_INTERVAL_S",), "composition.E073")
    if merged["DB_SLOW_QUERY_S"] is not None:
        messages += _not_positive_seconds(merged, ("DB_SLOW_QUERY_S",), "composition.E074")
    return messages


@register("composition")
def check_schedules(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    """Every declared schedule can run: a bad expression, an unknown zone or a payload its job
    refuses is reported now, naming the schedule, not at its first tick."""
    from composition.schedules import declared
    from composition.schedules.declaration import duplicate_names
    from composition.schedules.problems import problems

    messages: list[CheckMessage] = [
        Error(f"schedule {name!r} is declared twice with different arguments.",
              hint="Give one of them another name= (the name keys the schedule's state).", id="composition.E120")
        for name in sorted(set(duplicate_names()))]
    for name, entry in sorted(declared().items()):
        messages += [Error(f"schedule {name!r}: {problem}.", id="composition.E121") for problem in problems(entry)]
    # Tick rows are what an operator reads back of a catch-up: kept at least as long as a window.
    keep_s = conf.SCHEDULE_TICK_RETENTION_S
    windows = [(entry.catch_up_window.total_seconds(), name) for name, entry in declared().items()
               if entry.catch_up == "all" and entry.catch_up_window is not None]
    if keep_s is not None and windows and isinstance(keep_s, int | float) and max(windows)[0] > keep_s:
        window_s, name = max(windows)
        messages.append(Warning(
            f"COMPOSITION['SCHEDULE_TICK_RETENTION_S'] ({keep_s:g} s) is shorter than schedule {name!r}'s "
            f"catch_up_window ({window_s:g} s): its caught-up ticks would be pruned while still inside it.",
            hint="Raise SCHEDULE_TICK_RETENTION_S above the largest catch-up window.", id="composition.W122"))
    return messages


# Databases behind a transaction pooler: the settings they need, and (with database access) the
# role's timeouts read through the pooler.
register("composition")(check_pooled_settings)
register(Tags.database)(check_pooled_timeouts)


@register(Tags.database)
def check_queued_work(app_configs: Any = None, databases: Any = None, **_: Any) -> list[CheckMessage]:
    """Queued work the running code cannot run (``manage.py jobs check-compat``'s database part),
    only when a database is named: ``check --database default``, and ``migrate``, which runs the
    database checks first. So a warning, not an error: migrating comes before this check in a
    deploy and must not be stopped by it (a pipeline runs ``jobs check-compat``, which exits 1).
    Nothing before the first migrate, when the tables are not there yet."""
    if not databases or DEFAULT_DB_ALIAS not in databases:
        return []
    from django.db import connections

    from composition.broker.configured import configured_broker
    from composition.jobs.compatibility import queued_problems, reads_tables

    if not set(reads_tables()) <= set(connections[DEFAULT_DB_ALIAS].introspection.table_names()):
        return []
    return [Warning(f"{problem.count} {problem.source} of {problem.actor} (e.g. id {problem.example_id}): "
                    f"{problem.reason}.", hint="manage.py jobs check-compat lists them and exits 1; "
                    "docs/deployment.md says what to do before deploying.", id="composition.W140")
            for problem in queued_problems(configured_broker())]
