"""Fenced writes: a write guarded by a lock is applied only if its lock's fence is the newest the
database has seen for that resource, so a lock holder that paused past its TTL (GC, swap, a
frozen VM) cannot overwrite the work of the holder that came after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from composition.locks.errors import StaleFence
from composition.metrics import LOCK_FENCE_REJECTIONS, key_label

__all__ = ["fenced_write"]

_CLAIM = """
INSERT INTO composition_lock_fence (resource, fence, updated_at) VALUES (%s, %s, now())
ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence, updated_at = now()
WHERE composition_lock_fence.fence <= EXCLUDED.fence
RETURNING fence
"""


@contextmanager
def fenced_write(resource: str, fence: int, *, using: str | None = None) -> Iterator[None]:
    """Run the with-block in ``transaction.atomic()`` if ``fence`` is at least the newest fence
    recorded for ``resource``; record it as the newest. Raises StaleFence (before the block runs)
    otherwise. The record and the write commit or roll back together; the resource's fence row
    stays locked until then, so fenced writers of one resource are serialised.
    """
    from composition.locks.models import LockFence  # here: the app registry may not be ready at import

    longest = LockFence._meta.get_field("resource").max_length or 0
    if not isinstance(resource, str) or not resource or len(resource) > longest or "\x00" in resource:
        raise ValueError(f"a fenced resource is a non-empty string of at most {longest} characters without NUL, "
                         f"got {resource!r:.80}")
    if isinstance(fence, bool) or not isinstance(fence, int):
        raise TypeError(f"a fence is an integer (a lock's .fence), got {fence!r}")
    alias = using or DEFAULT_DB_ALIAS
    with transaction.atomic(using=alias):
        with connections[alias].cursor() as cursor:
            cursor.execute(_CLAIM, [resource, fence])
            if cursor.fetchone() is None:
                cursor.execute("SELECT fence FROM composition_lock_fence WHERE resource = %s", [resource])
                newest = int(cursor.fetchone()[0])
                LOCK_FENCE_REJECTIONS.labels(key_label(resource)).inc()
                raise StaleFence(resource, fence, newest)
        yield
