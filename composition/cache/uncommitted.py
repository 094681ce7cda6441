"""Whether what a loader reads now may never commit: the calling thread has a transaction open
that has written. A value read there is the transaction's own, so it is neither cached (a
ROLLBACK would leave it cached until its TTL) nor shared with other threads (which cannot see it).

PostgreSQL assigns a transaction id at a transaction's first write, so
``txid_current_if_assigned()`` tells a transaction that has written from one that has only read
(an ``ATOMIC_REQUESTS`` view that reads keeps caching). Asked only on a miss inside an atomic
block: one round trip then, none on a hit or outside a transaction. Another database than
PostgreSQL cannot tell: any open transaction counts as written.
"""

from __future__ import annotations

from django.db import connections

__all__ = ["reads_uncommitted_writes"]


def reads_uncommitted_writes() -> bool:
    """True when a transaction this thread has open, on any database, has written."""
    for wrapper in connections.all(initialized_only=True):
        if not wrapper.in_atomic_block:
            continue
        if wrapper.vendor != "postgresql":
            return True
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT txid_current_if_assigned() IS NOT NULL")
            if cursor.fetchone()[0]:
                return True
    return False
