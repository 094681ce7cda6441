"""cache_aside's hit path against a raw django-redis ``cache.get`` of the same value.

Both read a ~15-field dict from the same Redis; cache_aside also checks its namespace version in
the same round trip (one MGET) and counts the hit. Goal: <= 1.2x.
Run: ``python bench/bench_cache_hit.py`` (BENCH_CALLS, BENCH_ROUNDS to tune).
"""

from __future__ import annotations

import os
import sys
import uuid

from _util import compare, report, setup_django

setup_django()

from django.core.cache import caches  # noqa: E402

from composition.cache import cache_aside  # noqa: E402

CALLS = int(os.environ.get("BENCH_CALLS", "500"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "25"))
GOAL = 1.2


def main() -> int:
    value = {"id": 42, "number": "INV-0042", "status": "open", "currency": "EUR", "total": "129.90",
             "customer": {"id": 7, "name": "Ada Lovelace", "email": "ada@example.com"},
             "lines": [{"sku": f"SKU-{i}", "qty": i, "price": "9.99"} for i in range(5)],
             "paid": False, "due": "2025-01-31", "notes": None}
    cache = caches["default"]
    tag = uuid.uuid4().hex[:8]
    raw_key, key = f"bench:raw:{tag}", f"bench{tag}:invoice-42"
    cache.set(raw_key, value, 600)
    cache_aside(key, lambda: value, ttl_s=600)
    assert cache.get(raw_key) == cache_aside(key, lambda: None, ttl_s=600)

    candidate_s, baseline_s = compare(lambda: cache_aside(key, dict, ttl_s=600), lambda: cache.get(raw_key),
                                      calls=CALLS, rounds=ROUNDS)
    ok = report("cache_aside hit", "raw django-redis get", candidate_s, baseline_s, GOAL)
    cache.delete(raw_key)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
