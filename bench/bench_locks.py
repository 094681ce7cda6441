"""Lock overhead against the raw primitive, measured in the same run.

- ``advisory_lock`` in a transaction against ``SELECT pg_advisory_xact_lock(...)`` in a
  transaction (both: BEGIN, lock, COMMIT). Goal: <= 1.2x.
- ``redis_lock`` acquire + release (with a fencing token) against redis-py's ``Lock`` acquire +
  release on the same Redis. Goal: <= 1.3x.

Run: ``python bench/bench_locks.py`` (BENCH_CALLS, BENCH_ROUNDS to tune).
"""

from __future__ import annotations

import os
import sys
import uuid

from _util import compare, report, setup_django

setup_django()

from django.db import connection, transaction  # noqa: E402
from django_redis import get_redis_connection  # noqa: E402

from composition.locks import advisory_key, advisory_lock, redis_lock  # noqa: E402

CALLS = int(os.environ.get("BENCH_CALLS", "300"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "25"))


def bench_advisory() -> bool:
    key = uuid.uuid4().hex
    lock_id = advisory_key("bench", key)

    def raw() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [lock_id])

    def ours() -> None:
        with transaction.atomic(), advisory_lock("bench", key):
            pass

    candidate_s, baseline_s = compare(ours, raw, calls=CALLS, rounds=ROUNDS)
    return report("advisory_lock in a transaction", "raw pg_advisory_xact_lock", candidate_s, baseline_s, 1.2)


def bench_redis_lock() -> bool:
    client = get_redis_connection("default")
    name = f"bench:{uuid.uuid4().hex[:8]}"

    def raw() -> None:
        lock = client.lock(f"{name}:raw", timeout=5)
        assert lock.acquire(blocking=False)
        lock.release()

    def ours() -> None:
        with redis_lock(name, ttl_s=5):
            pass

    candidate_s, baseline_s = compare(ours, raw, calls=CALLS, rounds=ROUNDS)
    return report("redis_lock acquire+release", "redis-py Lock acquire+release", candidate_s, baseline_s, 1.3)


def main() -> int:
    results = [bench_advisory(), bench_redis_lock()]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
