"""Worker health: whether the worker processes beat recently and none is stuck on old work.

It reads the heartbeats ``runworkers`` writes to the cache's Redis (``heartbeats``) and, for one
host's view, this project's registry of worker processes (``composition.lifecycle.pids``). What
a changer must keep: it writes nothing, and an unreadable Redis fails the cluster's view while a
host's own (``local``) still answers from the worker processes it runs.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from composition.conf import conf
from composition.errors import described
from composition.health.checks import HealthReport
from composition.health.heartbeats import read_heartbeats, read_stale_workers
from composition.health.probes import heartbeat_client
from composition.lifecycle.pids import registered_at, registered_workers

__all__ = ["workers"]


def _host_and_pid(beat: dict[str, Any]) -> tuple[str, int | None]:
    host, _, pid = str(beat["worker"]).rpartition(":")
    return host, int(pid) if pid.isdigit() else None


def workers(*, local: bool = False) -> HealthReport:
    """Healthy when at least one worker process beat recently and none is stuck on old work.

    ``local`` looks only at this host's processes (a container's healthcheck: one stuck worker
    elsewhere must not mark this container unhealthy), skips a beat whose process no longer
    runs, so a container whose workers died is unhealthy at once rather than when their last
    beats expire, and counts one that runs without beating (frozen) as stuck once
    ``WORKER_STALE_AFTER_S`` has passed since it registered.
    """
    stale_after_s = float(conf.WORKER_STALE_AFTER_S)
    try:
        client = heartbeat_client()
        try:
            beats = read_heartbeats(client)
            stale = read_stale_workers(client)
        finally:
            client.close()
    except Exception as exc:
        error = described(exc)
        if local:
            # The heartbeats live in the cache's Redis, whose outage the workers ride out
            # (degraded): a container healthcheck must not call them dead for it, and have an
            # orchestrator restart working containers. What this host can still tell: whether
            # its worker processes run.
            alive = sorted(pid for pid, runs in registered_workers().items() if runs)
            return HealthReport("workers", bool(alive), detail={
                "error": error, "heartbeats": "unreadable", "worker_pids": alive})
        return HealthReport("workers", False, detail={"error": error})
    # Stale: stopped beating without withdrawing (killed or frozen); reported, and their
    # messages come back to the queue by the broker's own recovery.
    detail: dict[str, Any] = {"stale": stale} if stale else {}
    frozen: list[str] = []
    if local:
        hostname = socket.gethostname()
        # This project's processes of this host (composition.lifecycle.pids), not everything on the host
        # that shares its Redis: another checkout's workers, or the test suite's.
        registered = registered_workers()
        running = {pid for pid, runs in registered.items() if runs}

        def ours(row: dict[str, Any]) -> bool:
            host, pid = _host_and_pid(row)
            return host == hostname and pid in registered

        mine = [b for b in beats if ours(b)]
        gone = [b["worker"] for b in mine if _host_and_pid(b)[1] not in running]
        beats = [b for b in mine if b["worker"] not in gone]
        # A registered process of this host that runs without a fresh beat is frozen (stopped,
        # or blocked whole): as unhealthy as a stuck one, whatever its siblings do. Told by the
        # registry, not by its stale record in Redis, which a sibling's beat prunes after
        # PRUNE_AFTER_STALE_PERIODS. A worker registers just before its first beat, so one
        # registered less than a stale period ago is starting, not frozen.
        beating = {_host_and_pid(b)[1] for b in beats}
        registered_before = time.time() - stale_after_s
        frozen = [f"{hostname}:{pid}" for pid in sorted(running - beating)
                  if (since := registered_at(pid)) is not None and since <= registered_before]
        mine_stale = [row for row in stale if ours(row)]
        # This host's stale workers too: once a dead one's beat has aged out of the fresh ones,
        # they are what says why the check fails.
        detail = {"host": hostname, "gone": gone, **({"stale": mine_stale} if mine_stale else {})}
    now = time.time()
    fresh = [b for b in beats if now - b["beat_at"] <= stale_after_s]
    # A worker that keeps beating but has held a job for longer than that job may run (its
    # time limit, or WORKER_STUCK_AFTER_S for a job without one) is stuck.
    stuck = [b["worker"] for b in fresh if _holds_an_overdue_job(b, now, float(conf.WORKER_STUCK_AFTER_S))] + frozen
    ok = bool(fresh) and not stuck
    return HealthReport("workers", ok, detail={"workers": beats, "fresh": len(fresh), "stuck": stuck, **detail})


def _holds_an_overdue_job(beat: dict[str, Any], now: float, default_limit_s: float) -> bool:
    """Whether any job of the heartbeat ran past its own limit: not only the oldest, which may
    have an hour's limit while a younger one hangs far past its thirty seconds."""
    jobs = beat.get("jobs")
    if isinstance(jobs, list) and jobs and all(isinstance(job, dict) and "time_limit_s" in job for job in jobs):
        return any(now - job["started_at"] > (job["time_limit_s"] or default_limit_s) for job in jobs)
    # A heartbeat of a worker from before per-job limits: its oldest job only.
    started = beat.get("oldest_job_started_at")
    return started is not None and now - float(started) > float(beat.get("max_job_s") or default_limit_s)
