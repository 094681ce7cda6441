"""PostgreSQL policy under Django's ORM: session timeouts and their lift for ``migrate``
(``timeouts``), databases behind a transaction pooler (``pooling``), hooks run once after a commit
(``transactions``), slow-query logging (``slow_queries``), batched deletes (``pruning``), the
connection budget (``budget``), the connections each thread opened, which a job's time limit
cuts when the network never answers (``blocked_calls``), jsonb as raw SQL reads it (``jsonb``),
text PostgreSQL can store (``text``), which database errors pass (``failures``), and whether
composition's migrations are applied (``schema``).
Invariant: any PostgreSQL backend gives the same guarantees.
"""

from composition.db.budget import connection_budget
from composition.db.pruning import PruneResult, delete_in_batches
from composition.db.timeouts import close_all_connections, without_session_timeouts
from composition.db.transactions import on_commit_once

__all__ = ["PruneResult", "close_all_connections", "connection_budget", "delete_in_batches", "on_commit_once",
           "without_session_timeouts"]
