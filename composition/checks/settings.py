"""The checks of ``COMPOSITION``'s general keys (the broker, health, workers, queues), of the
cache-aside settings and of the metrics endpoint's."""

from __future__ import annotations

import difflib
import os
from os import PathLike
from typing import Any

import redis
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from composition.broker.configured import broker_kind
from composition.broker.rabbitmq_queues import check_rabbitmq_queue_settings
from composition.cache.serializers import load_serializer
from composition.checks.common import merged_settings, not_positive_integers, not_positive_seconds
from composition.conf import DEFAULTS
from composition.jobs.queue_order import QueueOrder
from composition.prometheus.access import parse_networks
from composition.prometheus.errors import MetricsAccessConfigurationError

__all__ = ["CACHE_POSITIVE_NUMBERS", "DEPENDENCIES", "DEPENDENCY_LEVELS", "DEPRECATED_KEYS", "POSITIVE_INTEGERS",
           "POSITIVE_NUMBERS", "check_cache_settings", "check_metrics_directory", "check_metrics_settings",
           "check_settings"]

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


@register("composition")
def check_settings(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    user = getattr(settings, "COMPOSITION", {})
    if not isinstance(user, dict):
        return [Error("COMPOSITION must be a dict.", id="composition.E001")]
    merged = {**DEFAULTS, **user}
    messages: list[CheckMessage] = []
    for key in sorted(set(user) - set(DEFAULTS)):
        close = difflib.get_close_matches(str(key), DEFAULTS, n=1)
        messages.append(Error(f"COMPOSITION has unknown key {key!r}"
                              + (f"; did you mean {close[0]!r}?" if close else "."),
                              hint="docs/configuration.md lists every key.", id="composition.E002"))
    try:
        broker_kind(str(merged["BROKER_URL"]))
    except Exception as exc:
        messages.append(Error(str(exc), id="composition.E003"))
    messages += not_positive_seconds(merged, POSITIVE_NUMBERS, "composition.E004")
    messages += not_positive_integers(merged, POSITIVE_INTEGERS, "composition.E005")
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
        # A warning: test settings with LocMemCache (no worker, no lock) stay usable; what needs
        # Redis says so when used (composition.conf.redis_client_of).
        messages.append(Warning(f"CACHES[{alias!r}] is not a django-redis cache; cache-aside, redis locks, job "
                                "limits and worker heartbeats need one.",
                                hint="BACKEND: 'django_redis.cache.RedisCache' (docs/install.md)",
                                id="composition.W001"))
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


CACHE_POSITIVE_NUMBERS = ("CACHE_LEASE_TTL_S", "CACHE_LEASE_WAIT_S", "CACHE_BREAKER_RESET_S",
                          "CACHE_REPLAY_INTERVAL_S")


@register("composition")
def check_cache_settings(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    merged = merged_settings()
    if merged is None:
        return []
    messages = not_positive_seconds(merged, CACHE_POSITIVE_NUMBERS, "composition.E040")
    messages += not_positive_integers(merged, ("CACHE_BREAKER_FAILURES",), "composition.E041")
    try:
        load_serializer(merged["CACHE_SERIALIZER"])
    except Exception as exc:
        messages.append(Error(str(exc), id="composition.E042"))
    cache = getattr(settings, "CACHES", {}).get(merged["CACHE_ALIAS"], {})
    options = cache.get("OPTIONS") or {}
    messages += _unusable_redis_location(merged["CACHE_ALIAS"], cache)
    if "django_redis" in str(cache.get("BACKEND", "")) and not (
            options.get("SOCKET_TIMEOUT") and options.get("SOCKET_CONNECT_TIMEOUT")):
        messages.append(Warning(
            f"CACHES[{merged['CACHE_ALIAS']!r}] has no SOCKET_TIMEOUT / SOCKET_CONNECT_TIMEOUT: a dead or "
            "frozen Redis then blocks cache_aside and redis_lock callers indefinitely.",
            hint="Set both to a fraction of a second (the example project uses 0.25).",
            id="composition.W041"))
    return messages


def _unusable_redis_location(alias: str, cache: dict[str, Any]) -> list[CheckMessage]:
    """E043 for a django-redis cache whose LOCATION is no Redis URL: taken for an outage, the
    worker started its jobs and then failed its start on the heartbeat, naming neither."""
    if "django_redis" not in str(cache.get("BACKEND", "")):
        return []
    location = cache.get("LOCATION")
    for url in location if isinstance(location, list | tuple) else [location]:
        try:
            redis.ConnectionPool.from_url(str(url))  # parses only: no connection is made
        except Exception as exc:
            return [Error(f"CACHES[{alias!r}]['LOCATION'] is not a usable Redis URL ({url!r}): {exc}",
                          id="composition.E043")]
    return []


@register("composition")
def check_metrics_settings(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    merged = merged_settings()
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
    messages += not_positive_seconds(merged, ("METRICS_SAMPLE_INTERVAL_S",), "composition.E073")
    if merged["DB_SLOW_QUERY_S"] is not None:
        messages += not_positive_seconds(merged, ("DB_SLOW_QUERY_S",), "composition.E074")
    for variable in ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir"):
        # prometheus_client turns multiprocess mode on for the variable's presence, and an empty
        # one puts its files in the working directory (a checkout, say), where nothing archives them.
        if variable in os.environ and not os.environ[variable].strip():
            messages.append(Error(f"the environment variable {variable} is set but empty: prometheus_client then "
                                  "writes its metrics files into the working directory.",
                                  hint="Unset it (one process), or name a directory of its own.",
                                  id="composition.E075"))
    return messages


@register("composition", deploy=True)
def check_metrics_directory(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    """``check --deploy`` only: one process serving its own metrics is fine while developing."""
    from composition.prometheus.directory import multiproc_dir

    # The library's own reading of it: the lowercase name alone leaves our metrics per process.
    if multiproc_dir() is not None:
        return []
    return [Warning("the environment variable PROMETHEUS_MULTIPROC_DIR is not set: each gunicorn worker's /metrics "
                    "shows its own process only, and the workers' job metrics never reach the web's /metrics.",
                    hint="Set it in the environment of the web and worker processes, one directory per host or "
                         "container (docs/install.md, 'Metrics from every process').", id="composition.W076")]
