"""The composition PostgreSQL backend: django-prometheus' (query metrics), plus the library's
own rows sent with the next statement or COMMIT (``composition.deferred_writes``).

Use it as ``DATABASES["default"]["ENGINE"] = "composition.db.postgresql"``. Any other PostgreSQL
backend works too; the library then inserts those rows at once, one round trip each.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError
from django_prometheus.db.backends.postgresql import base

from composition.deferred_writes import HeldWrites, send_held_first

__all__ = ["DatabaseWrapper"]


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held_writes = HeldWrites()
        # Every savepoint open now, atomic's and those of transaction.savepoint() alike (Django
        # tracks only atomic's): a row published under a savepoint may yet be rolled back with
        # it, so its send after COMMIT confirms it first (composition.transactions).
        self.open_savepoint_ids: list[str] = []
        # First, so the held rows go before whatever the other wrappers send; it outlives
        # reconnections, and execute_wrapper() blocks only pop what they pushed.
        self.execute_wrappers.insert(0, send_held_first)

    def _commit(self) -> None:
        if self.held_writes.failed and self._transaction_failed():
            # Held rows failed with a statement of the caller's, whose error was caught inside
            # the atomic block: the transaction is aborted, and COMMIT would roll it back silently.
            raise DatabaseError("this transaction was aborted by rows held for its COMMIT, whose error was raised "
                                "earlier and caught; nothing of it is committed")
        if self.held_writes and self.connection is not None:
            # One string: PostgreSQL runs the INSERTs, then COMMIT, and stops at the first error
            # (the transaction is then aborted and Django's atomic rolls it back and raises).
            with self.cursor() as cursor:
                self.held_writes.send(cursor, then="COMMIT")
        super()._commit()  # psycopg sends nothing when the server is idle already
        self.open_savepoint_ids.clear()

    def _rollback(self) -> None:
        self.held_writes.drop()
        self.open_savepoint_ids.clear()
        super()._rollback()

    def _close(self) -> None:
        self.held_writes.drop()
        self.open_savepoint_ids.clear()
        super()._close()

    def _savepoint(self, sid: str) -> None:
        super()._savepoint(sid)
        self.open_savepoint_ids.append(sid)

    def _savepoint_rollback(self, sid: str) -> None:
        # What is held now was written after the last statement sent, so inside this savepoint:
        # rolled back with it, it need not go out (nor fail there, where atomic would swallow it).
        failed = self.held_writes.failed
        self.held_writes.drop()
        super()._savepoint_rollback(sid)
        self._end_savepoints(sid, keep_it=True)  # ROLLBACK TO keeps sid, ends the ones inside it
        # Held rows that failed inside the savepoint are undone with it; ones that failed before it
        # (with its SAVEPOINT statement) leave the transaction aborted, and COMMIT must say so.
        self.held_writes.failed = failed and self._transaction_failed()

    def _transaction_failed(self) -> bool:
        from psycopg import pq

        pgconn = getattr(self.connection, "pgconn", None)
        return pgconn is not None and pgconn.transaction_status == pq.TransactionStatus.INERROR

    def _savepoint_commit(self, sid: str) -> None:
        super()._savepoint_commit(sid)
        self._end_savepoints(sid, keep_it=False)  # RELEASE ends sid and the ones inside it

    def _end_savepoints(self, sid: str, *, keep_it: bool) -> None:
        if sid in self.open_savepoint_ids:
            del self.open_savepoint_ids[self.open_savepoint_ids.index(sid) + int(keep_it):]
