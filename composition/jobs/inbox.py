"""The inbox ledger: a message id's database effects commit at most once.

``record_processed(message_id, actor)`` inserts the ledger row inside the caller's transaction; it answers
False when the id is already there. A concurrent redelivery of the same message waits on the
unique index until the first transaction ends, then sees the row (committed: skip) or takes
over (rolled back: run), so two deliveries never both commit effects.

The ledger key is the message id, except for a replayed dead letter: its message carries the
original message's id as ``idempotency_key`` in its composition headers, so the replay and a
late redelivery of the original cannot both commit effects (``ledger_key``).

One round trip: ``@job(idempotent=True)`` opens its transaction and writes the ledger row first,
and psycopg would send that transaction's BEGIN as a round trip of its own before the INSERT.
When nothing of the transaction has reached the server yet, the INSERT goes out with the BEGIN
instead, in one string (``_insert_with_begin``), so the ledger costs the worker no round trip of
its own: with ``bench/bench_throughput.py`` that extra round trip was most of the ledger's price
(the worker's CPU per job, hence its rate, within a few percent of the same job without the
ledger once it was gone). Anywhere else (a transaction already under way, query logging on, an
execute wrapper that may want a cursor) the ordinary cursor sends the INSERT.
"""

from __future__ import annotations

from functools import cache, partial
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from dramatiq.broker import MessageProxy

from composition.begin import begin_sql
from composition.deferred_writes import send_held_first
from composition.jobs.interrupted_queries import cancel_on_interrupt
from composition.slow_queries import time_query

__all__ = ["IDEMPOTENCY_KEY_HEADER", "ledger_key", "record_processed"]

# Key in message.options["composition"] that replaces the message id in the ledger.
IDEMPOTENCY_KEY_HEADER = "idempotency_key"

# Execute wrappers known to need no cursor in their context (the slow-query timer, the interrupt
# cancel): the one-string path runs them around its statement; with any other it is not taken.
_CURSORLESS_WRAPPERS = (time_query, send_held_first, cancel_on_interrupt)


def ledger_key(message: MessageProxy) -> str:
    """The id under which ``message``'s effects are recorded: its idempotency key, else its id."""
    headers: Any = message.options.get("composition")
    if isinstance(headers, dict):
        key = headers.get(IDEMPOTENCY_KEY_HEADER)
        if isinstance(key, str) and key:
            return key
    return str(message.message_id)


@cache
def _insert_sql() -> str:
    # Imported here: composition.jobs (hence this module) may be imported before Django's apps are.
    from composition.jobs.models import ProcessedMessage

    table = connections[DEFAULT_DB_ALIAS].ops.quote_name(ProcessedMessage._meta.db_table)
    # ON CONFLICT DO NOTHING instead of catching IntegrityError: a failed INSERT would abort the
    # caller's transaction (PostgreSQL) unless wrapped in a savepoint.
    return (f"INSERT INTO {table} (message_id, actor, processed_at) VALUES (%s, %s, now())"
            " ON CONFLICT (message_id) DO NOTHING")


def record_processed(message_id: str, actor: str) -> bool:
    """Insert the ledger row for ``message_id`` (a ``ledger_key``); False when it was processed
    already.

    Must run inside ``transaction.atomic()`` together with the job's effects. Database errors are
    Django's (``django.db.OperationalError`` for a statement timeout, and so on).
    """
    # The wrapper itself, not django.db.connection: every attribute of that proxy is a look-up.
    connection = connections[DEFAULT_DB_ALIAS]
    begin = _begin_with(connection)
    if begin is not None:
        return _insert_with_begin(connection, begin, message_id, actor)
    with connection.cursor() as cursor:
        cursor.execute(_insert_sql(), [message_id, actor])
        return bool(cursor.rowcount == 1)


def _begin_with(connection: BaseDatabaseWrapper) -> bytes | None:
    """The BEGIN that psycopg is about to send on its own before the next statement of
    ``connection`` (``composition.begin``), or None when it is not or when the one-string path
    must not be taken: query logging on (``DEBUG``, ``CaptureQueriesContext`` see only what goes
    through a cursor), an execute wrapper that may want a cursor."""
    if connection.queries_logged or any(wrapper not in _CURSORLESS_WRAPPERS for wrapper in connection.execute_wrappers):
        return None
    try:
        # psycopg's generators and Connection.wait/lock are its internals (how it runs its own
        # BEGIN); a psycopg without them takes the ordinary path, and tests/test_inbox.py fails
        # loudly should their behaviour change under the same names.
        from psycopg import generators
    except ImportError:  # psycopg2
        return None
    begin = begin_sql(connection)
    raw = connection.connection
    if begin is None or not hasattr(raw, "wait") or not hasattr(generators, "execute"):
        return None
    return begin.encode()


def _insert_with_begin(connection: BaseDatabaseWrapper, begin: bytes, message_id: str, actor: str) -> bool:
    """``BEGIN; INSERT ...`` as one string (PostgreSQL's simple protocol runs both, and stops at
    the first error). The connection is then inside the transaction, as after psycopg's own
    BEGIN; COMMIT or ROLLBACK go through Django as usual. Execute wrappers run around it with no
    cursor in their context, and see the SQL without its parameters."""
    from psycopg import errors, generators, pq

    raw = connection.connection
    encoding = raw.info.encoding
    quote = pq.Escaping(raw.pgconn).escape_literal
    sql = _insert_sql()
    statement = begin + b"; " + sql.encode(encoding) % (quote(message_id.encode(encoding)),
                                                        quote(actor.encode(encoding)))

    def execute(sql: str, params: Any, many: bool, context: dict[str, Any]) -> bool:
        # Sent and awaited the way psycopg runs its own BEGIN: the wait leaves the GIL (a
        # redelivery may wait here for the first delivery's transaction) and a connection closed
        # meanwhile from another thread fails here instead of under libpq's feet.
        with raw.lock:
            raw.pgconn.send_query(statement)
            result = raw.wait(generators.execute(raw.pgconn))[-1]  # the INSERT's, or the first error
        if result.status != pq.ExecStatus.COMMAND_OK:
            raise errors.error_from_result(result, encoding=encoding)
        return result.command_tuples == 1

    run = execute
    for wrapper in reversed(connection.execute_wrappers):
        run = partial(wrapper, run)
    with connection.wrap_database_errors:
        return bool(run(f"{begin.decode()}; {sql}", None, False, {"connection": connection, "cursor": None}))


# The old name ("claim" also means the outbox relay's lease), kept for callers outside the app.
claim = record_processed
