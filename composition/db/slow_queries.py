"""Slow queries: every query timed against ``COMPOSITION['DB_SLOW_QUERY_S']``.

A query that takes longer is counted in ``composition_db_slow_queries_total{alias}`` and logged
with its SQL (never its parameters, which may hold personal data), cut to ``MAX_SQL_CHARS``.
A query that fails (a ``statement_timeout``, a lock time-out) counts too: the time was spent.

django-prometheus' database backend already gives the latency histogram
(``django_db_query_duration_seconds``); a histogram cannot say which statement was slow, nor
count against a threshold the project chose, hence this small wrapper beside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog
from django.db.backends.base.base import BaseDatabaseWrapper

from composition.conf import conf
from composition.metrics import DB_SLOW_QUERIES_TOTAL

__all__ = ["MAX_SQL_CHARS", "count_slow_queries", "time_query"]

log = structlog.get_logger("composition.database")

MAX_SQL_CHARS = 500


def time_query(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
    """An ``execute_wrapper``: run the query, and count and log it when it was slow."""
    threshold_s = conf.DB_SLOW_QUERY_S
    if threshold_s is None:
        return execute(sql, params, many, context)
    started = time.perf_counter()
    try:
        return execute(sql, params, many, context)
    finally:
        elapsed_s = time.perf_counter() - started
        if elapsed_s >= threshold_s:
            alias = context["connection"].alias
            DB_SLOW_QUERIES_TOTAL.labels(alias).inc()
            log.warning("slow query", alias=alias, duration_s=round(elapsed_s, 3), threshold_s=threshold_s,
                        many=many, sql=str(sql)[:MAX_SQL_CHARS])


def count_slow_queries(sender: Any, connection: BaseDatabaseWrapper, **_: Any) -> None:
    """``connection_created`` receiver: time every query of ``connection`` from now on.

    Inserted first, not appended: ``connection.execute_wrapper()`` blocks pop the last wrapper
    when they end, and a connection opened inside such a block would otherwise lose ours and keep
    theirs. The wrapper object outlives reconnections, so it is installed once."""
    if time_query not in connection.execute_wrappers:
        connection.execute_wrappers.insert(0, time_query)
