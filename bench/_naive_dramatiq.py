"""bench_throughput's naive Dramatiq contender: what a Django project gets from Dramatiq alone.

A plain ``RedisBroker`` with Dramatiq's default middleware (AgeLimit, TimeLimit,
ShutdownNotifications, Callbacks, Pipelines, Retries) plus django_dramatiq's
``DbConnectionsMiddleware``, and two actors: ``naive_stamp``, whose body is ``bench_stamp``'s
(tests/jobsapp/jobs.py), and ``naive_ledger_stamp``, the same after an inbox ledger row written by
hand in the job's transaction, as ``bench_stamp_idempotent`` runs (the durable work of
``idempotent=True`` on plain Dramatiq, for reference).
The worker is Dramatiq's own CLI, from the repository's root: ``dramatiq bench._naive_dramatiq:broker
--processes 1 --threads 8`` with ``DJANGO_SETTINGS_MODULE=bench._naive_settings``; the bench imports
this module too, to send (Django is set up already there).
"""

from __future__ import annotations

import os
import time

import django
import dramatiq
import redis
from django.apps import apps
from django.conf import settings
from django.db import connection, transaction
from django_dramatiq.middleware import DbConnectionsMiddleware
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import default_middleware

if not apps.ready:  # the CLI's worker process; the bench has set Django up already
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench._naive_settings")
    django.setup()

__all__ = ["LEDGER_ACTOR", "LEDGER_TABLE", "NAIVE_QUEUE", "STAMPS_KEY", "broker", "naive_ledger_stamp", "naive_stamp"]

NAIVE_QUEUE = "bench_naive_dramatiq"
# bench_stamp's list (tests.jobsapp.jobs.BENCH_STAMPS_KEY; bench_throughput checks they agree).
STAMPS_KEY = "bench:job-stamps"


def _broker_url() -> str:
    # The same in both processes: bench._naive_settings names tests.settings' COMPOSITION["BROKER_URL"].
    url = getattr(settings, "BENCH_NAIVE_BROKER_URL", None) or settings.COMPOSITION["BROKER_URL"]
    return str(url)


broker = RedisBroker(url=_broker_url(),
                     middleware=[*(middleware() for middleware in default_middleware), DbConnectionsMiddleware()])

_stamps_client: redis.Redis | None = None


def _stamp(seq: int) -> None:
    """bench_stamp's body: one Redis list entry "<seq> <unix time at start>"."""
    global _stamps_client
    if _stamps_client is None:
        _stamps_client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    _stamps_client.rpush(STAMPS_KEY, f"{seq} {time.time()}")


# As bench_stamp: never retried (max_attempts=1).
naive_stamp = dramatiq.actor(_stamp, actor_name="bench_naive_stamp", queue_name=NAIVE_QUEUE, broker=broker,
                             max_retries=0)

# composition's inbox ledger (ProcessedMessage; bench_throughput checks the name), written as
# composition.jobs.inbox does; composition is not installed here.
LEDGER_TABLE = "composition_processedmessage"
LEDGER_ACTOR = "bench_naive_ledger_stamp"
_LEDGER_SQL = (f"INSERT INTO {LEDGER_TABLE} (message_id, actor, processed_at) VALUES (%s, %s, now())"
               " ON CONFLICT (message_id) DO NOTHING")


def _ledger_stamp(seq: int) -> None:
    """bench_stamp_idempotent's work: the ledger row, then the stamp, in one transaction."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_LEDGER_SQL, [f"naive-ledger-{seq}", LEDGER_ACTOR])
            if cursor.rowcount != 1:
                return  # processed already
        _stamp(seq)


naive_ledger_stamp = dramatiq.actor(_ledger_stamp, actor_name=LEDGER_ACTOR, queue_name=NAIVE_QUEUE, broker=broker,
                                    max_retries=0)
