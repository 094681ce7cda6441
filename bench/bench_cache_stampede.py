"""Recomputations of one hot key under load: cache_aside against a naive cache-aside.

32 readers (4 processes x 8 threads) read one key for 10 s; the value lives 1 s (no jitter, so
the ideal is exactly one recomputation per expiry: ceil(10 s / 1 s) = 10) and takes 50 ms to
compute. The naive version is ``get``; on a miss ``load`` and ``set`` (django-redis). Goal:
cache_aside's recomputations <= 1.2x the ideal. Run: ``python bench/bench_cache_stampede.py``.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from _util import setup_django

setup_django()

from django.core.cache import caches  # noqa: E402
from django.db import connections  # noqa: E402

from composition.cache import cache_aside  # noqa: E402

DURATION_S = float(os.environ.get("BENCH_DURATION_S", "10"))
TTL_S, LOADER_S = 1.0, 0.05
PROCESSES, THREADS = 4, 8
GOAL = 1.2


def naive(key: str, loader: Callable[[], Any]) -> Any:
    cache = caches["default"]
    value = cache.get(key)
    if value is None:
        value = loader()
        cache.set(key, value, TTL_S)
    return value


def composed(key: str, loader: Callable[[], Any]) -> Any:
    return cache_aside(key, loader, ttl_s=TTL_S, jitter=0)


def _process(strategy: str, key: str, start_at: float, loads: Any) -> None:
    read = naive if strategy == "naive" else composed

    def loader() -> dict[str, float]:
        with loads.get_lock():
            loads.value += 1
        time.sleep(LOADER_S)
        return {"computed_at": time.time()}

    def reader() -> None:
        while time.time() < start_at:
            time.sleep(0.001)
        while time.time() < start_at + DURATION_S:
            assert read(key, loader) is not None
            time.sleep(0.001)

    threads = [threading.Thread(target=reader) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def run(strategy: str) -> int:
    context = multiprocessing.get_context("fork")
    loads = context.Value("i", 0)
    key = f"bench{uuid.uuid4().hex[:8]}:hot"
    start_at = time.time() + 0.5
    connections.close_all()
    processes = [context.Process(target=_process, args=(strategy, key, start_at, loads))
                 for _ in range(PROCESSES)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    assert all(process.exitcode == 0 for process in processes)
    return int(loads.value)


def main() -> int:
    ideal = math.ceil(DURATION_S / TTL_S)
    ours = run("cache_aside")
    baseline = run("naive")
    ratio = ours / ideal
    print(f"stampede recomputations ({PROCESSES * THREADS} readers, {DURATION_S:.0f} s, TTL {TTL_S:.0f} s, "
          f"loader {LOADER_S * 1000:.0f} ms): cache_aside {ours} vs ideal {ideal}: {ratio:.2f}x "
          f"(goal <= {GOAL}x); naive cache-aside {baseline} ({baseline / ideal:.1f}x ideal) "
          f"{'ok' if ratio <= GOAL else 'OVER GOAL'}")
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
