"""The composition PostgreSQL backend: django-prometheus' (query metrics), plus the library's
own rows sent with the next statement or COMMIT (``composition.deferred_writes``).

Use it as ``DATABASES["default"]["ENGINE"] = "composition.db.postgresql"``. Any other PostgreSQL
backend works too; the library then inserts those rows at once, one round trip each.
"""

from __future__ import annotations

from typing import Any

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
        super()._savepoint_rollback(sid)
        self._end_savepoints(sid, keep_it=True)  # ROLLBACK TO keeps sid, ends the ones inside it

    def _savepoint_commit(self, sid: str) -> None:
        super()._savepoint_commit(sid)
        self._end_savepoints(sid, keep_it=False)  # RELEASE ends sid and the ones inside it

    def _end_savepoints(self, sid: str, *, keep_it: bool) -> None:
        if sid in self.open_savepoint_ids:
            del self.open_savepoint_ids[self.open_savepoint_ids.index(sid) + int(keep_it):]
