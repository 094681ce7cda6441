"""System checks for COMPOSITION mistakes, reported by ``manage.py check``."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from composition.conf import DEFAULTS

POSITIVE_NUMBERS = (
    "BROKER_HEARTBEAT_TIMEOUT_S", "DB_STATEMENT_TIMEOUT_S", "DB_IDLE_IN_TRANSACTION_TIMEOUT_S",
    "HEALTH_DEADLINE_S", "HEALTH_CACHE_S", "SHUTDOWN_TIMEOUT_S", "WORKER_HEARTBEAT_S",
    "WORKER_STALE_AFTER_S",
)
POSITIVE_INTEGERS = ("WORKER_PROCESSES", "WORKER_THREADS", "WORKER_IDLE_POLL_MS")
DEPENDENCY_LEVELS = ("critical", "degraded", "ignore")


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
        from composition.broker import broker_kind

        broker_kind(str(merged["BROKER_URL"]))
    except Exception as exc:
        messages.append(Error(str(exc), id="composition.E003"))
    for key in POSITIVE_NUMBERS:
        value = merged[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            messages.append(Error(f"COMPOSITION[{key!r}] must be a positive number of seconds, got {value!r}.",
                                  id="composition.E004"))
    for key in POSITIVE_INTEGERS:
        value = merged[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            messages.append(Error(f"COMPOSITION[{key!r}] must be a positive integer, got {value!r}.",
                                  id="composition.E005"))
    levels = merged["HEALTH_DEPENDENCIES"]
    if not isinstance(levels, dict) or any(v not in DEPENDENCY_LEVELS for v in levels.values()):
        messages.append(Error(f"COMPOSITION['HEALTH_DEPENDENCIES'] values must be one of {DEPENDENCY_LEVELS}.",
                              id="composition.E006"))
    alias = merged["CACHE_ALIAS"]
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        messages.append(Error(f"COMPOSITION['CACHE_ALIAS'] names {alias!r}, which is not in CACHES.",
                              id="composition.E007"))
    elif "django_redis" not in str(caches[alias].get("BACKEND", "")):
        messages.append(Warning(f"CACHES[{alias!r}] is not a django-redis cache; cache-aside and "
                                "redis locks need one.", id="composition.W001"))
    if merged["LOG_FORMAT"] not in ("json", "console"):
        messages.append(Error("COMPOSITION['LOG_FORMAT'] must be 'json' or 'console'.", id="composition.E008"))
    if not messages and merged["WORKER_STALE_AFTER_S"] <= merged["WORKER_HEARTBEAT_S"]:
        messages.append(Warning("WORKER_STALE_AFTER_S should be several WORKER_HEARTBEAT_S, or live "
                                "workers look dead.", id="composition.W002"))
    return messages
