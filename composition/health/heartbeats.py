"""Worker heartbeats in Redis, for ``health workers`` and the operators reading it.

Each worker process writes its own key (expiring after ``WORKER_STALE_AFTER_S``, so a killed
process disappears by itself) and its id into one sorted set scored by the beat time, so a
reader finds every worker with one ZRANGEBYSCORE and one MGET, never a SCAN of the keyspace.
"""

from __future__ import annotations

import json
import time
from typing import Any

from composition.conf import conf

__all__ = ["REGISTRY_KEY", "clear_heartbeat", "read_heartbeats", "read_stale_workers", "write_heartbeat"]

KEY_PREFIX = "composition:worker:"
REGISTRY_KEY = "composition:workers"
# Registry members older than this many stale periods are pruned by the writers.
PRUNE_AFTER_STALE_PERIODS = 10


def write_heartbeat(client: Any, worker_id: str, state: dict[str, Any]) -> None:
    """Record one worker process's heartbeat (one pipelined round trip)."""
    now = time.time()
    stale_after_s = float(conf.WORKER_STALE_AFTER_S)
    payload = dict(state, worker=worker_id, beat_at=now)
    pipe = client.pipeline(transaction=False)
    pipe.set(KEY_PREFIX + worker_id, json.dumps(payload), ex=max(1, int(stale_after_s)))
    pipe.zadd(REGISTRY_KEY, {worker_id: now})
    pipe.zremrangebyscore(REGISTRY_KEY, "-inf", now - PRUNE_AFTER_STALE_PERIODS * stale_after_s)
    pipe.execute()


def clear_heartbeat(client: Any, worker_id: str) -> None:
    """Withdraw a worker that stopped cleanly."""
    pipe = client.pipeline(transaction=False)
    pipe.delete(KEY_PREFIX + worker_id)
    pipe.zrem(REGISTRY_KEY, worker_id)
    pipe.execute()


def read_heartbeats(client: Any) -> list[dict[str, Any]]:
    """The latest heartbeat of every worker that beat within ``WORKER_STALE_AFTER_S``."""
    since = time.time() - float(conf.WORKER_STALE_AFTER_S)
    ids = [raw.decode() if isinstance(raw, bytes) else raw
           for raw in client.zrangebyscore(REGISTRY_KEY, since, "+inf")]
    if not ids:
        return []
    beats = [json.loads(raw) for raw in client.mget([KEY_PREFIX + worker_id for worker_id in ids]) if raw]
    return sorted(beats, key=lambda beat: beat["worker"])


def read_stale_workers(client: Any) -> list[dict[str, Any]]:
    """Workers whose last beat is older than ``WORKER_STALE_AFTER_S`` but still remembered (the
    registry keeps them ``PRUNE_AFTER_STALE_PERIODS`` stale periods): killed or frozen
    processes, with when they last beat. Their beats themselves have expired."""
    stale_after_s = float(conf.WORKER_STALE_AFTER_S)
    now = time.time()
    rows = client.zrangebyscore(REGISTRY_KEY, now - PRUNE_AFTER_STALE_PERIODS * stale_after_s,
                                f"({now - stale_after_s}", withscores=True)
    return [{"worker": worker.decode() if isinstance(worker, bytes) else worker, "beat_at": beat_at}
            for worker, beat_at in rows]
