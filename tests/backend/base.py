"""The tests' database backend: the example project's (django-prometheus' PostgreSQL), with a
flush that deletes rows instead of truncating tables.

Django empties every table after each transactional test with one TRUNCATE, which gives each
table, index and TOAST table new files. A gate flushes some 400 times: over 100,000 files that
every checkpoint then fsyncs (70 s of fsync in one gate), stalling the commits of every shard,
and a DROP DATABASE (an immediate checkpoint) waited 40 s for them. DELETE keeps the files.
A table that held many rows is truncated after all, so later tests never scan its dead rows:
autovacuum is off on the gate's server.
"""

from __future__ import annotations

from typing import Any

from django_prometheus.db.backends.postgresql import base

__all__ = ["DatabaseWrapper"]

# Over this many rows deleted, the table is truncated too (its dead rows would stay: no autovacuum).
TRUNCATE_OVER_ROWS = 1000

# One statement, in the flush's transaction: every table emptied with the foreign keys' triggers
# off (replica role, as TRUNCATE ignores them), a table that held many rows truncated after.
_FLUSH_SQL = """DO $flush$
DECLARE
  deleted bigint;
  name text;
BEGIN
  SET LOCAL session_replication_role = replica;
  FOREACH name IN ARRAY %s::text[] LOOP
    EXECUTE format('DELETE FROM %%I', name);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    IF deleted > %d THEN
      EXECUTE format('TRUNCATE %%I CASCADE', name);
    END IF;
  END LOOP;
END
$flush$;"""


def _array_literal(tables: list[str]) -> str:
    items = ",".join('"' + table.replace("\\", "\\\\").replace('"', '\\"') + '"' for table in tables)
    return "'{" + items.replace("'", "''") + "}'"


class DatabaseOperations(base.DatabaseWrapper.ops_class):  # type: ignore[name-defined,misc]
    def sql_flush(self, style: Any, tables: Any, *, reset_sequences: bool = False,
                  allow_cascade: bool = False) -> list[str]:
        if not tables or reset_sequences:  # sequences restart with TRUNCATE's RESTART IDENTITY
            return list(super().sql_flush(style, tables, reset_sequences=reset_sequences,
                                          allow_cascade=allow_cascade))
        return [_FLUSH_SQL % (_array_literal(sorted(tables)), TRUNCATE_OVER_ROWS)]


class DatabaseWrapper(base.DatabaseWrapper):  # type: ignore[misc]
    ops_class = DatabaseOperations
