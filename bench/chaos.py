"""Chaos soak: nothing published through the outbox is lost, whatever crashes while it flows.

N idempotent jobs (``crash_effect``, inbox ledger) and N non-idempotent ones
(``crash_effect_plain``) are published through the outbox, in transactions (10 % of them with an
ordering key), into real ``manage.py runworkers`` processes (Redis broker). Every job writes one
``Effect(key)`` row, a table without a unique constraint, so a job that ran twice shows up twice.
While the jobs flow:

- the ``runworkers`` process group is SIGKILLed K times and a new one started each time; every
  second kill (``--relay-kill-every``) lands with the relay mid-batch: a burst is published in
  one transaction that only nudges the relay (``composition.testing.left_to_the_relay``), the
  broker is frozen (so no row can be marked sent), and the group dies as soon as its relay holds
  a lease on outbox rows (claimed, maybe enqueued, not marked sent); the broker is then thawed;
- the broker restarts: a private Valkey with ``appendonly yes`` and ``appendfsync always`` (an
  acknowledged enqueue is on disk), stopped gracefully (SIGTERM) and started again on the same
  port and data;
- PostgreSQL restarts: a private, migrated server, stopped with a fast shutdown (every session
  cut) and started again on its data;
- with ``--broker-wipes``, the broker is killed and started again without its data: the
  idempotent jobs on it are sent again from the outbox once their redelivery window has passed
  (``composition.jobs.broker_losses``); the non-idempotent ones on it are lost by design, noted
  when the broker goes (sent, no effect yet) and reported apart, not as lost;
- with ``--host-blackholes``, a second group ("host b", jobs only) reaches PostgreSQL and Redis
  through a ``FaultProxy`` each, which swallows every byte for ``--blackhole-s``, then resets
  what it swallowed and passes again: host b's jobs run on the first group, and host b works
  again once let back.

Publishing goes on into both restarts (a few transactions a second): transactions the database
refuses are retried, and a transaction whose COMMIT failed is looked up afterwards (its outbox ids
were allocated at insert), so the set of committed jobs is known exactly. Otherwise the publisher
keeps at most ``--max-backlog`` jobs published and not yet done. Faults are spread evenly over
the run by finished jobs, each one only once work flows again after the last. A group that exits
by itself (one started while the broker is down refuses to start) is restarted, as a process
supervisor would, and reported.

At the end it prints lost jobs (a committed job with no effect within ``--recovery-deadline-s``
of the last fault or publish; 0 allowed, each lost job traced through its outbox row, the broker,
the inbox ledger and the dead letters), duplicate effects (0 allowed for idempotent jobs, counted
for the others), effects of jobs whose publish never committed (0 allowed), per fault the time
until effects flow again and until everything published before it is done, commit-to-effect
latency, and the backlog left (pending outbox rows, broker queues). Exit status 1 when anything
was lost, an idempotent effect doubled or a phantom effect appeared; 2 when the soak could not
run to the end.

Only private servers are used (``composition.testing.ThrowawayRedis`` / ``ThrowawayPostgres``),
and everything the soak starts is stopped at the end, on failure, SIGINT and SIGTERM too (after a
SIGKILL of the soak itself, PostgreSQL and the workers die with it; the Valkey server does not).
Logs are kept in a directory printed at the end when the soak fails (``--keep-logs``: always).

Run: ``python bench/chaos.py`` (N = 100,000, K = 20: a quarter of an hour or more on 2 cores), or
smaller: ``python bench/chaos.py --jobs 2500 --kills 5``. Every flag also reads ``CHAOS_<FLAG>``
from the environment (``CHAOS_JOBS=10000 CHAOS_KILLS=8``). ``--overrides`` (JSON) sets
``COMPOSITION`` keys in the publisher and in every worker, e.g. ``'{"OUTBOX_LEASE_S": 4}'``.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from composition.testing import (  # noqa: E402
    FaultProxy,
    ThrowawayPgBouncer,
    ThrowawayPostgres,
    ThrowawayRedis,
    WorkerProcess,
)

T = TypeVar("T")

IDEMPOTENT, PLAIN = "idempotent", "non-idempotent"
# Faults that publish a burst of their own first (--relay-burst jobs in one transaction).
BURST_FAULTS = ("relay kill", "broker wipe")
SETTINGS_MODULE = "tests.settings"
POOLED_SETTINGS_MODULE = "tests.settings_pgbouncer"  # TRANSACTION_POOLED_DATABASES = ["default"]
# How long a database call in the soak retries while PostgreSQL is down before giving up.
DB_WAIT_S = 120.0
POLL_S = 0.2
PR_SET_PDEATHSIG = 1
# Between two publishing transactions while a server restarts.
UNTHROTTLED_PAUSE_S = 0.25


# -- command line ------------------------------------------------------------------------------------------
def _env(name: str, default: T) -> T:
    raw = os.environ.get(f"CHAOS_{name.upper()}")
    if raw is None:
        return default
    return type(default)(raw)  # type: ignore[call-arg]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add("--jobs", type=int, default=_env("jobs", 100_000), help="N: idempotent jobs, and as many non-idempotent")
    add("--kills", type=int, default=_env("kills", 20), help="K: SIGKILLs of the runworkers process group")
    add("--broker-restarts", type=int, default=_env("broker_restarts", 1))
    add("--postgres-restarts", type=int, default=_env("postgres_restarts", 1))
    add("--broker-wipes", type=int, default=_env("broker_wipes", 0),
        help="broker restarts without its data: idempotent jobs on it come back from the inbox ledger once their "
             "redelivery window has passed; non-idempotent ones are lost by design and reported apart")
    add("--host-blackholes", type=int, default=_env("host_blackholes", 0),
        help="a second runworkers group ('host b', reaching PostgreSQL and Redis through fault proxies) runs "
             "beside the first; this many times it is cut off (blackholed) for --blackhole-s, then let back")
    add("--blackhole-s", type=float, default=_env("blackhole_s", 30.0))
    add("--relay-kill-every", type=int, default=_env("relay_kill_every", 2),
        help="every n-th kill (the first included) lands with the relay mid-batch; 0: none")
    add("--relay-burst", type=int, default=_env("relay_burst", 2000),
        help="jobs published in the one transaction before a relay kill (nudge-only) or a broker wipe")
    add("--per-transaction", type=int, default=_env("per_transaction", 50), help="jobs per publishing transaction")
    add("--max-backlog", type=int, default=_env("max_backlog", 0),
        help="the publisher waits while this many published jobs are not done (0: a tenth of the steady "
             "stream, at most 5,000, so publishing lasts through most of the faults)")
    add("--keyed", type=float, default=_env("keyed", 0.1),
        help="fraction of jobs published with an ordering key (64 keys), the rest without")
    add("--processes", type=int, default=_env("processes", 1), help="runworkers --processes")
    add("--threads", type=int, default=_env("threads", 8), help="runworkers --threads")
    add("--broker-down-s", type=float, default=_env("broker_down_s", 2.0))
    add("--postgres-down-s", type=float, default=_env("postgres_down_s", 2.0))
    add("--recovery-deadline-s", type=float, default=_env("recovery_deadline_s", 180.0),
        help="a job with no effect this long after the last fault (or the last publish) is lost")
    add("--stall-s", type=float, default=_env("stall_s", 120.0),
        help="no job finishing for this long stops the faults and goes straight to the final count")
    add("--pgbouncer", type=int, default=_env("pgbouncer", 0), metavar="POOL_SIZE",
        help="every process (publisher, workers, relay) reaches PostgreSQL through a private PgBouncer in "
             "pool_mode=transaction with this many server connections (0: directly); migrations go direct")
    add("--overrides", default=_env("overrides", "{}"), help="COMPOSITION overrides (JSON) for every process")
    add("--seed", type=int, default=_env("seed", 1))
    add("--keep-logs", action="store_true", default=bool(_env("keep_logs", "")))
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.kills < 0 or args.per_transaction < 1 or 0 < args.max_backlog < args.per_transaction \
            or args.pgbouncer < 0 or min(args.broker_restarts, args.postgres_restarts, args.broker_wipes,
                                         args.host_blackholes) < 0 or args.blackhole_s <= 0:
        parser.error("need --jobs >= 1, --kills >= 0, --per-transaction >= 1, --max-backlog >= --per-transaction, "
                     "--pgbouncer >= 0, no negative count of restarts, wipes or blackholes, --blackhole-s > 0")
    json.loads(args.overrides)
    return args


# -- the run's records ---------------------------------------------------------------------------------------
@dataclass
class Fault:
    kind: str  # "kill", "relay kill", "broker restart", "postgres restart", "broker wipe", "host blackhole"
    started_at: float = 0.0  # Unix time the fault began (kill, shutdown)
    done_at: float = 0.0  # Unix time the fault was over (new group spawned, server answering)
    note: str = ""


@dataclass
class Job:
    key: str  # the Effect key: "i0000042" (idempotent) or "p0000042"
    actor: Any
    order_key: str | None  # the outbox ordering key, if any


@dataclass
class Stats:
    transactions: int = 0
    attempts: int = 0
    failed_attempts: int = 0
    commits_looked_up: int = 0
    committed: dict[str, float] = field(default_factory=dict)  # Effect key -> commit time (Unix)
    first_publish_at: float = 0.0
    last_publish_at: float = 0.0


def db_call(fn: Callable[[], T], *, wait_s: float = DB_WAIT_S) -> T:
    """``fn()``, retried while the database is unreachable (a restart), up to ``wait_s``."""
    from django.db import Error, connection

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return fn()
        except Error:
            _close_connection(connection)
            if time.monotonic() > deadline:
                raise
            time.sleep(POLL_S)


def _close_connection(connection: Any) -> None:
    try:
        connection.close()
    except Exception:
        pass


def effects_count() -> int:
    from tests.jobsapp.models import Effect

    return db_call(lambda: Effect.objects.count())


# -- publishing --------------------------------------------------------------------------------------------
class Publisher(threading.Thread):
    """Publishes the plan in transactions of ``per_transaction`` jobs, keeping at most
    ``max_backlog`` jobs published and not done; retries a transaction the database refused,
    and looks up the outcome of a COMMIT that failed, so ``stats.committed`` is exact."""

    def __init__(self, plan: list[Job], *, per_transaction: int, max_backlog: int) -> None:
        super().__init__(name="chaos-publisher", daemon=True)
        self.plan = plan
        self.per_transaction = per_transaction
        self.max_backlog = max_backlog
        self.stats = Stats()
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        # Set around a server restart: publish without waiting for the backlog, into the outage.
        self.unthrottled = threading.Event()
        self._next = 0
        self._plan_lock = threading.Lock()
        self._cv = threading.Condition()
        self._want_pause = False
        self._is_paused = False
        self._done_seen = 0
        self._done_seen_at = 0.0
        # Jobs done, or never to be (the soak's ``finished``).
        self.finished: Callable[[], int] = effects_count

    def take(self, count: int) -> list[Job]:
        with self._plan_lock:
            batch = self.plan[self._next:self._next + count]
            self._next += len(batch)
            return batch

    # The controller publishes its bursts with the publisher paused (between two transactions).
    def pause(self) -> None:
        with self._cv:
            self._want_pause = True
            while not self._is_paused and self.is_alive():
                self._cv.wait(0.1)

    def resume(self) -> None:
        with self._cv:
            self._want_pause = False
            self._cv.notify_all()

    def run(self) -> None:
        from django.db import connection

        try:
            while not self.stopping.is_set():
                with self._cv:
                    while self._want_pause and not self.stopping.is_set():
                        self._is_paused = True
                        self._cv.notify_all()
                        self._cv.wait(0.1)
                    self._is_paused = False
                if self.unthrottled.is_set():
                    # A few transactions a second into the outage, not the whole plan at once.
                    time.sleep(UNTHROTTLED_PAUSE_S)
                elif self._backlog() >= self.max_backlog:
                    time.sleep(0.05)
                    continue
                batch = self.take(self.per_transaction)
                if not batch:
                    return
                self.commit(batch)
        except BaseException as exc:  # reported by the controller
            self.error = exc
        finally:
            with self._cv:
                self._is_paused = True
                self._cv.notify_all()
            _close_connection(connection)

    def _backlog(self) -> int:
        now = time.monotonic()
        if now - self._done_seen_at >= POLL_S:
            self._done_seen, self._done_seen_at = self.finished(), now
        return len(self.stats.committed) - self._done_seen

    def commit(self, batch: list[Job]) -> list[int]:
        """Publish ``batch`` in one transaction, again until it has committed exactly once; return
        the outbox ids."""
        from django.db import Error, connection, transaction

        from composition.outbox import publish

        stats = self.stats
        while True:
            stats.attempts += 1
            ids: list[int] = []
            try:
                with transaction.atomic():
                    for job in batch:
                        ids.append(publish(job.actor, {"key": job.key}, key=job.order_key).pk)
                committed = True
            except Error:
                stats.failed_attempts += 1
                _close_connection(connection)
                committed = False
                if len(ids) == len(batch):
                    # COMMIT itself failed: it may have happened anyway. The ids were allocated
                    # at insert, so the rows say which it was.
                    stats.commits_looked_up += 1
                    committed = self._rows_exist(ids)
                if not committed:
                    time.sleep(POLL_S)
            if committed:
                now = time.time()
                stats.transactions += 1
                stats.first_publish_at = stats.first_publish_at or now
                stats.last_publish_at = now
                for job in batch:
                    stats.committed[job.key] = now
                return ids

    @staticmethod
    def _rows_exist(ids: list[int]) -> bool:
        from composition.outbox import OutboxMessage

        found = db_call(lambda: OutboxMessage.objects.filter(pk__in=ids).count())
        if found not in (0, len(ids)):
            raise RuntimeError(f"{found} of {len(ids)} rows of one transaction exist: a partial commit")
        return found == len(ids)


def build_plan(jobs: int, keyed: float, rng: random.Random) -> list[Job]:
    from tests.jobsapp import jobs as jobsapp

    plan = []
    for index in range(jobs):
        for prefix, actor in (("i", jobsapp.crash_effect), ("p", jobsapp.crash_effect_plain)):
            order_key = f"chaos-{rng.randrange(64)}" if rng.random() < keyed else None
            plan.append(Job(f"{prefix}{index:07d}", actor, order_key))
    return plan


def flowing_threshold(args: argparse.Namespace) -> int:
    """Jobs finished after a fault that show work flowing again (more than a group's prefetch)."""
    return max(25, 3 * args.threads * args.processes)


def kind_of(key: str) -> str:
    return IDEMPOTENT if key.startswith("i") else PLAIN


# -- the broker's view ----------------------------------------------------------------------------------------
def broker_backlog(client: Any, queues: Sequence[str], namespace: str = "dramatiq") -> dict[str, dict[str, int]]:
    """Per queue: ``ready`` (waiting to be fetched), ``held`` (fetched, not acknowledged yet:
    in a worker or left by a dead one), ``delayed`` (retries waiting for their time), ``dead``
    (Dramatiq's own dead-letter queue)."""
    result = {}
    for queue in queues:
        base = f"{namespace}:{queue}"
        ready, stored = int(client.llen(base)), int(client.hlen(f"{base}.msgs"))
        result[queue] = {"ready": ready, "held": max(0, stored - ready),
                         "delayed": int(client.hlen(f"{base}.DQ.msgs")), "dead": int(client.zcard(f"{base}.XQ"))}
    return result


def backlog_total(backlog: dict[str, dict[str, int]]) -> int:
    return sum(q["ready"] + q["held"] + q["delayed"] for q in backlog.values())


# -- worker groups ---------------------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the soak dies, even by SIGKILL (its finally never runs)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


class Worker(WorkerProcess):
    """``runworkers`` in its own session, as ``WorkerProcess`` starts it, that also dies with the soak."""

    def start(self) -> Worker:
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=self._log,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=_die_with_parent)
        return self

    def descendants(self) -> list[Any]:
        import psutil

        try:
            return list(psutil.Process(self.pid).children(recursive=True)) if self.process is not None else []
        except psutil.NoSuchProcess:
            return []

    def crash(self, children: list[Any] | None = None) -> None:
        """SIGKILL the group and every process it started (``children``, when listed beforehand):
        with ``--processes`` > 1 the worker processes have sessions of their own (and would only
        get SIGTERM from their parent's death)."""
        import psutil

        if self.process is None:
            return
        children = self.descendants() if children is None else children
        self.kill_group()
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(children, timeout=10)


# -- the soak ------------------------------------------------------------------------------------------------
class Soak:
    def __init__(self, args: argparse.Namespace, redis_server: ThrowawayRedis, postgres: ThrowawayPostgres,
                 log_dir: Path) -> None:
        import redis

        from composition.conf import conf
        from composition.health.probes import cache_redis_url
        from composition.jobs.policy import redelivery_window_s
        from composition.outbox.relay import RELAY_QUEUE_NAME
        from tests.jobsapp import jobs as jobsapp

        self.args = args
        self.redis_server = redis_server
        self.postgres = postgres
        self.log_dir = log_dir
        self.rng = random.Random(args.seed)
        self.queues = [jobsapp.CRASH_QUEUE, jobsapp.CRASH_PLAIN_QUEUE]
        threads = ["--processes", str(args.processes), "--threads", str(args.threads)]
        self.worker_args = [*threads, "--queues", ",".join([*self.queues, RELAY_QUEUE_NAME])]
        self.workers: list[Worker] = []
        # With --host-blackholes, "host b": a second group that runs jobs (not the relay, so a
        # relay kill still finds the relay in the first group) through a proxy to each server.
        self.remote_args = [*threads, "--queues", ",".join(self.queues)]
        self.remote_workers: list[Worker] = []
        self.proxies: list[FaultProxy] = []
        if args.host_blackholes:
            database = urlsplit(os.environ["DATABASE_URL"])
            self.proxies = [FaultProxy(database.hostname or "127.0.0.1", database.port or 5432).start(),
                            FaultProxy("127.0.0.1", redis_server.port).start()]
            # Nor the sweep: a relay kill must find every lease in the group it kills.
            overrides = {**json.loads(os.environ.get("COMPOSITION_TEST_OVERRIDES") or "{}"),
                         "OUTBOX_SWEEP_INTERVAL_S": 24 * 3600.0}
            self.remote_env = {**os.environ, "TEST_HOST": "b", "COMPOSITION_TEST_OVERRIDES": json.dumps(overrides),
                               "DATABASE_URL": self.proxies[0].proxied_url(os.environ["DATABASE_URL"]),
                               **{name: self.proxies[1].proxied_url(os.environ[name])
                                  for name in ("BROKER_URL", "REDIS_URL")}}
        # A broker wipe's idempotent jobs are sent again once this window has passed (their rows'
        # due time plus crash_effect's redelivery window); its non-idempotent jobs are lost.
        self.window_s = redelivery_window_s(jobsapp.crash_effect.options["job_policy"],
                                            heartbeat_timeout_s=float(conf.BROKER_HEARTBEAT_TIMEOUT_S),
                                            lease_s=float(conf.OUTBOX_LEASE_S))
        if args.broker_wipes and args.recovery_deadline_s <= self.window_s + float(conf.BROKER_LOSS_CHECK_INTERVAL_S):
            raise ValueError(f"--recovery-deadline-s {args.recovery_deadline_s:.0f} is too short for a broker wipe: "
                             f"crash_effect's redelivery window is {self.window_s:.0f} s")
        # What broker wipes took: every job on the broker, and its non-idempotent ones.
        self.wiped: set[str] = set()
        self.wiped_plain: set[str] = set()
        # Of those, the ones no effect has been seen for yet: finished() asks only about these, and
        # drops what it finds (an effect row stays). Changed on the publisher's thread and this one.
        self.wiped_not_run: set[str] = set()
        self.wiped_lock = threading.Lock()
        self.faults: list[Fault] = []
        # The Redis databases the settings gave the broker and the cache (tests.settings moves them
        # off the server URL's own): reading the URL's database would find an empty broker and no
        # heartbeat, ever.
        self.client = redis.Redis.from_url(str(conf.BROKER_URL), socket_timeout=5, socket_connect_timeout=2)
        self.heartbeats = redis.Redis.from_url(cache_redis_url(), socket_timeout=5, socket_connect_timeout=2)
        plan = build_plan(args.jobs, args.keyed, self.rng)
        self.fault_kinds = self.fault_plan()
        # The bursts of relay kills and wipes are kept apart from the steady stream, so the last
        # one has jobs too.
        bursts = sum(self.fault_kinds.count(kind) for kind in BURST_FAULTS)
        self.burst = min(args.relay_burst, len(plan) // (2 * bursts)) if bursts else 0
        split = len(plan) - self.burst * bursts
        self.bursts = [plan[split + index * self.burst:split + (index + 1) * self.burst] for index in range(bursts)]
        max_backlog = args.max_backlog or max(4 * args.per_transaction, min(5000, split // 10))
        self.publisher = Publisher(plan[:split], per_transaction=args.per_transaction, max_backlog=max_backlog)
        self.publisher.finished = self.finished
        self.planned = len(plan)
        self.stalled = ""
        # (time, host, exit code, last log line) of every group that exited by itself.
        self.exits: list[tuple[float, str, int, str]] = []
        self.final_exit_code: int | None = None
        self.remote_exit_code: int | None = None

    def next_burst(self) -> list[Job]:
        return self.bursts[sum(fault.kind in BURST_FAULTS for fault in self.faults)]

    def finished(self) -> int:
        """Effects so far, plus the jobs a broker wipe took that have not run (again): the
        progress faults are spread by and the publisher is throttled by, which would otherwise
        wait out the idempotent ones' redelivery window, and the non-idempotent ones for ever."""
        from tests.jobsapp.models import Effect

        with self.wiped_lock:
            if self.wiped_not_run:
                waiting = list(self.wiped_not_run)
                ran = db_call(lambda: set(Effect.objects.filter(key__in=waiting).values_list("key", flat=True)))
                self.wiped_not_run -= ran
            return effects_count() + len(self.wiped_not_run)

    @property
    def worker(self) -> Worker:
        return self.workers[-1]

    def spawn(self) -> float:
        worker = Worker(self.worker_args, env={**os.environ, "TEST_HOST": "a"}, cwd=str(ROOT)).start()
        self.workers.append(worker)
        self.spawned_at = time.time()
        return self.spawned_at

    def spawn_remote(self) -> None:
        self.remote_workers.append(Worker(self.remote_args, env=self.remote_env, cwd=str(ROOT)).start())

    def _wait_until_beating(self, timeout_s: float) -> None:
        """Until the current group has started (its first worker heartbeat), so that its drain is
        measured rather than a SIGTERM that lands while Django is still loading."""
        from composition.health.heartbeats import REGISTRY_KEY

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.worker.process is not None \
                and self.worker.process.poll() is None:
            try:
                if self.heartbeats.zrangebyscore(REGISTRY_KEY, self.spawned_at, "+inf"):
                    return
            except Exception:
                pass
            time.sleep(POLL_S)

    def fault_plan(self) -> list[str]:
        args = self.args
        every = args.relay_kill_every
        kills = ["relay kill" if every and index % every == 0 else "kill" for index in range(args.kills)]
        plan = list(kills)
        # The other faults go between kills, spread over the run: a blackhole first, as the stream
        # of jobs it must not hold up is still long, a wipe last (its jobs wait out a window anyway).
        extra = (["host blackhole"] * args.host_blackholes + ["broker restart"] * args.broker_restarts
                 + ["postgres restart"] * args.postgres_restarts + ["broker wipe"] * args.broker_wipes)
        for number, kind in enumerate(extra, start=1):
            plan.insert(round(number * (len(plan) + 1) / (len(extra) + 1)), kind)
        return plan

    def run(self) -> None:
        plan = self.fault_kinds
        spacing = len(self.publisher.plan) / (len(plan) + 1)
        self.spawn()
        if self.proxies:
            self.spawn_remote()
        self.started_at = time.time()
        self.publisher.start()
        flowing_from = 0
        for index, kind in enumerate(plan):
            # Evenly spread over the steady stream (plus the bursts so far), and never before the
            # last fault's damage is visibly repaired.
            bursts_done = sum(len(burst) for burst in self.bursts[:sum(map(plan[:index].count, BURST_FAULTS))])
            target = max(round((index + 1) * spacing) + bursts_done, flowing_from + flowing_threshold(self.args))
            if not self._wait(lambda target=target: self.finished() >= target):
                self.stalled = (f"no job finished for {self.args.stall_s:.0f} s before fault {index + 1} ({kind}); "
                                f"the remaining faults and jobs were skipped")
                self.publisher.stopping.set()
                break
            fault = Fault(kind)
            refused_before = self.publisher.stats.failed_attempts
            published_before = len(self.publisher.stats.committed)
            if kind == "relay kill":
                self.relay_kill(fault)
            elif kind == "kill":
                self.kill(fault)
            elif kind == "host blackhole":
                self.blackhole_remote(fault)
            elif kind == "broker wipe":
                self.wipe_broker(fault)
            else:
                # Publishing goes on into the outage: transactions cut by a PostgreSQL shutdown,
                # after-commit sends refused by a broker that is down.
                self.publisher.unthrottled.set()
                time.sleep(0.1)
                try:
                    if kind == "broker restart":
                        fault.started_at = time.time()
                        self.redis_server.restart(down_s=self.args.broker_down_s)
                        fault.done_at = time.time()
                        fault.note = f"down {fault.done_at - fault.started_at:.1f} s"
                    else:
                        self.restart_postgres(fault)
                finally:
                    self.publisher.unthrottled.clear()
            self.faults.append(fault)
            flowing_from = self.finished()
            stats = self.publisher.stats
            if kind.endswith("restart"):
                fault.note += f"; {len(stats.committed) - published_before} jobs published meanwhile"
            if kind == "postgres restart":
                fault.note += f", {stats.failed_attempts - refused_before} transactions refused and retried"
            print(f"  fault {index + 1}/{len(plan)} at {fault.started_at - self.started_at:6.1f} s: {kind}"
                  f"{' (' + fault.note + ')' if fault.note else ''}; {flowing_from:,} effects, "
                  f"{len(self.publisher.stats.committed):,} of {self.planned:,} jobs published", flush=True)
        if not self._wait(lambda: not self.publisher.is_alive()):
            self.stalled = self.stalled or (f"no job finished for {self.args.stall_s:.0f} s while publishing; "
                                            f"the remaining jobs were skipped")
            self.publisher.stopping.set()
            self.publisher.join(30)
        self.drain()

    def _wait(self, predicate: Callable[[], bool]) -> bool:
        """Wait until ``predicate()``, restarting a worker that exited on its own; False when no job
        has finished for ``--stall-s``."""
        last, changed_at = -1, time.monotonic()
        while True:
            if self.publisher.error is not None:
                raise RuntimeError("the publisher failed") from self.publisher.error
            self.supervise()
            if predicate():
                return True
            done = self.finished()
            if done != last:
                last, changed_at = done, time.monotonic()
            elif time.monotonic() - changed_at > self.args.stall_s:
                return False
            time.sleep(POLL_S)

    def supervise(self) -> None:
        """Start a new group when the current one exited by itself, as a process supervisor would."""
        for group, start in ((self.workers, self.spawn), (self.remote_workers, self.spawn_remote)):
            process = group[-1].process if group else None
            if process is None or process.poll() is None:
                continue
            lines = [line for line in group[-1].output().splitlines() if line.strip()]
            host = "a" if group is self.workers else "b"
            self.exits.append((time.time(), host, int(process.returncode), lines[-1][:300] if lines else ""))
            start()

    # -- faults ------------------------------------------------------------------------------------------
    def kill(self, fault: Fault) -> None:
        # Somewhere inside the stream: between jobs, inside one, or during an ack.
        time.sleep(self.rng.uniform(0.0, 0.5))
        fault.started_at = time.time()
        self.worker.crash()
        fault.done_at = self.spawn()
        fault.note = "mid-stream"

    def relay_kill(self, fault: Fault) -> None:
        """Publish a burst in one transaction that only nudges the relay, and SIGKILL the group as
        soon as its relay holds leased rows: claimed, maybe enqueued, not yet marked sent."""
        from django.db.models.functions import Now

        from composition.outbox import OutboxMessage
        from composition.testing import left_to_the_relay

        def leased() -> int:
            return db_call(lambda: OutboxMessage.objects.filter(status="pending", claimed_until__gt=Now()).count())

        self.publisher.pause()
        try:
            burst = self.next_burst()
            ids: list[int] = []
            if burst:
                with left_to_the_relay():
                    ids = self.publisher.commit(burst)
            # The broker stops answering at once (frozen, not down): whichever way the relay takes
            # the burst (its nudge, already sent, or a sweep), it cannot mark a row sent without
            # the broker's answer, so its lease stays visible until the kill. Polling for a lease
            # the relay holds for milliseconds missed it now and then.
            self.redis_server.freeze()
            try:
                children = self.worker.descendants()  # listed now: the kill must follow the sighting at once

                def unsent() -> int:
                    return db_call(lambda: OutboxMessage.objects.filter(pk__in=ids, status="pending").count())

                committed_at = time.monotonic()
                while time.monotonic() < committed_at + 30.0 and not leased() and unsent():
                    time.sleep(0.001)
                waited_s = time.monotonic() - committed_at
                fault.started_at = time.time()
                self.worker.crash(children)
            finally:
                self.redis_server.thaw()
            held = leased()  # nobody else relays while the publisher is paused: the dead relay's rows
            sent = len(ids) - unsent()
        finally:
            self.publisher.resume()
        fault.done_at = self.spawn()
        fault.note = f"{len(burst)} jobs in one transaction, {sent} of them sent before the kill; "
        if held:
            fault.note += f"the relay died holding {held} leased rows ({waited_s:.2f} s after the commit)"
        else:
            fault.note += f"relay NOT caught mid-batch (killed {waited_s:.2f} s after the commit)"

    def wipe_broker(self, fault: Fault) -> None:
        """Publish a burst and wait until the relay has sent it; freeze the broker (nothing more
        is sent to it), note the jobs it holds (sent, no effect yet), start it again without its
        data."""
        from django.db.models import Exists, OuterRef
        from django.db.models.fields.json import KT

        from composition.outbox import OutboxMessage
        from tests.jobsapp.models import Effect

        def on_the_broker() -> set[str]:
            return set(db_call(lambda: list(
                OutboxMessage.objects.filter(status="sent").annotate(effect_key=KT("payload__key"))
                .filter(~Exists(Effect.objects.filter(key=OuterRef("effect_key"))))
                .values_list("effect_key", flat=True))))

        self.publisher.pause()
        try:
            burst = self.next_burst()
            ids = self.publisher.commit(burst) if burst else []
            wait_until = time.monotonic() + 30.0
            while time.monotonic() < wait_until and db_call(
                    lambda: OutboxMessage.objects.filter(pk__in=ids, status="pending").exists()):
                time.sleep(0.01)
            self.redis_server.freeze()
            try:
                on_it = on_the_broker()
            finally:
                fault.started_at = time.time()
                self.redis_server.wipe(down_s=self.args.broker_down_s)
        finally:
            self.publisher.resume()
        fault.done_at = time.time()
        plain = {key for key in on_it if kind_of(key) == PLAIN}
        # Rebound, not changed in place: the publisher's thread reads them.
        self.wiped, self.wiped_plain = self.wiped | on_it, self.wiped_plain | plain
        with self.wiped_lock:
            self.wiped_not_run |= on_it
        fault.note = (f"{len(burst)} jobs in one transaction, then down {fault.done_at - fault.started_at:.1f} s; "
                      f"{len(on_it) - len(plain)} idempotent and {len(plain)} non-idempotent jobs on it")

    def blackhole_remote(self, fault: Fault) -> None:
        """Cut host b off from PostgreSQL and Redis (its proxies swallow every byte, both ways) for
        ``--blackhole-s``, then let it back: the bytes swallowed are gone, as its connections."""
        from tests.jobsapp.models import Effect

        ran = db_call(lambda: Effect.objects.filter(host="b").count())
        # Meanwhile one transaction a second, not the publisher's pace: the stream must outlast
        # the cut (host a runs it alone), and the faults after it.
        self.publisher.pause()
        published = 0
        fault.started_at = time.time()
        for proxy in self.proxies:
            proxy.blackhole()
        try:
            while time.time() < fault.started_at + self.args.blackhole_s:
                self.supervise()
                batch = self.publisher.take(self.args.per_transaction)
                if batch:
                    self.publisher.commit(batch)
                    published += len(batch)
                time.sleep(max(0.0, 1.0 - (time.time() - fault.started_at) % 1.0))
        finally:
            for proxy in self.proxies:
                proxy.reset()
                proxy.pass_through()
            self.publisher.resume()
        fault.done_at = time.time()
        fault.note = (f"host b cut off {fault.done_at - fault.started_at:.1f} s, after running {ran:,} jobs; "
                      f"{published:,} jobs published meanwhile")

    def restart_postgres(self, fault: Fault) -> None:
        from django.db import connection

        fault.started_at = time.time()
        self.postgres.stop()
        time.sleep(self.args.postgres_down_s)
        self.postgres.start()
        fault.done_at = time.time()
        _close_connection(connection)
        fault.note = f"down {fault.done_at - fault.started_at:.1f} s"

    # -- the end -----------------------------------------------------------------------------------------
    def drain(self) -> None:
        """Wait until every committed job has its effect and the outbox and broker hold nothing
        (so no late redelivery can still add a duplicate), or until the recovery deadline."""
        from django.db.models import Count

        from composition.outbox import OutboxMessage
        from tests.jobsapp.models import Effect

        last_fault = max((fault.done_at for fault in self.faults), default=0.0)
        self.deadline_from = max(last_fault, self.publisher.stats.last_publish_at)
        deadline = self.deadline_from + self.args.recovery_deadline_s
        committed = self.publisher.stats.committed
        while time.time() < deadline:
            self.supervise()
            distinct = db_call(lambda: Effect.objects.aggregate(n=Count("key", distinct=True))["n"])
            pending = db_call(lambda: OutboxMessage.objects.filter(status="pending").count())
            # Jobs a wipe took may be done too: only the keys tell whether every other one is.
            if distinct >= len(committed) - len(self.wiped_plain) and pending == 0 \
                    and backlog_total(broker_backlog(self.client, self.queues)) == 0 \
                    and self.wiped_plain >= committed.keys() - set(db_call(
                        lambda: list(Effect.objects.values_list("key", flat=True).distinct()))):
                break
            time.sleep(0.5)
        self.drained_at = time.time()
        self._wait_until_beating(timeout_s=30.0)
        self.final_exit_code = _terminated(self.worker)
        self.remote_exit_code = _terminated(self.remote_workers[-1]) if self.remote_workers else None


def _terminated(worker: Worker) -> int | None:
    """``worker``'s exit code once it drained (None when it did not exit in time)."""
    try:
        return worker.terminate(timeout_s=60)
    except Exception:
        return None


# -- the report ------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    committed: dict[str, float]  # key -> commit time
    counts: dict[str, int]  # key -> effects
    first_at: dict[str, float]  # key -> time of its first effect
    created: list[float]  # every effect's time, sorted

    def open_at(self, at: float, committed_times: list[float], first_times: list[float]) -> int:
        """Jobs committed by ``at`` and not done by then."""
        return bisect.bisect_right(committed_times, at) - bisect.bisect_right(first_times, at)


def collect(soak: Soak) -> Outcome:
    from django.db.models import Count, Min

    from tests.jobsapp.models import Effect

    rows = db_call(lambda: list(Effect.objects.values("key").annotate(n=Count("id"), first=Min("created_at"))))
    created = sorted(t.timestamp() for t in db_call(lambda: list(Effect.objects.values_list("created_at", flat=True))))
    return Outcome(committed=dict(soak.publisher.stats.committed), counts={row["key"]: row["n"] for row in rows},
                   first_at={row["key"]: row["first"].timestamp() for row in rows}, created=created)


def fault_lines(soak: Soak, outcome: Outcome) -> list[str]:
    """One line per fault: when effects flowed again after it, and when every job committed
    before it was done (but those a broker wipe took: the wipe's own line counts its idempotent
    ones)."""
    lines = [f"  {'#':>2}  {'at':>7}  {'fault':<17} {'flowing again':>13}  {'pre-fault backlog done':>28}  note"]
    flowing_after = flowing_threshold(soak.args)
    for number, fault in enumerate(soak.faults, start=1):
        # Work flows again when the fault is over; a cut host's work, on the other while it lasts.
        since = fault.started_at if fault.kind == "host blackhole" else fault.done_at
        index = bisect.bisect_right(outcome.created, since) + flowing_after - 1
        flowing = f"{outcome.created[index] - fault.started_at:.1f} s" if index < len(outcome.created) else "never"
        open_keys = [key for key, at in outcome.committed.items()
                     if at <= fault.started_at and outcome.first_at.get(key, float("inf")) > fault.started_at
                     and key not in (soak.wiped_plain if fault.kind == "broker wipe" else soak.wiped)]
        if not open_keys:
            drained = "nothing open"
        elif any(key not in outcome.first_at for key in open_keys):
            drained = f"never ({len(open_keys):,} open)"
        else:
            last = max(outcome.first_at[key] for key in open_keys)
            drained = f"{last - fault.started_at:.1f} s ({len(open_keys):,} open)"
        lines.append(f"  {number:>2}  {fault.started_at - soak.started_at:6.1f}s  {fault.kind:<17} {flowing:>13}  "
                     f"{drained:>28}  {fault.note}")
    return lines


def latency_lines(soak: Soak, outcome: Outcome) -> list[str]:
    """Commit to first effect, and where the slowest jobs waited (outbox or broker/worker)."""
    from composition.outbox import OutboxMessage

    done = sorted((max(0.0, outcome.first_at[key] - at), key) for key, at in outcome.committed.items()
                  if key in outcome.first_at)
    if not done:
        return []

    def pick(q: float) -> float:
        return done[min(len(done) - 1, int(q * len(done)))][0]

    lines = [f"  commit -> first effect: p50 {pick(0.5):.2f} s, p99 {pick(0.99):.2f} s, max {done[-1][0]:.2f} s"]
    slowest = [key for _, key in done[-3:]]
    rows = db_call(lambda: list(OutboxMessage.objects.filter(payload__key__in=slowest)
                                .values_list("payload__key", "sent_at", "attempts")))
    for key, sent_at, attempts in sorted(rows, key=lambda row: -outcome.first_at[row[0]] + outcome.committed[row[0]]):
        commit = outcome.committed[key]
        to_sent = f"{sent_at.timestamp() - commit:.2f} s" if sent_at else "never"
        to_effect = f"{outcome.first_at[key] - sent_at.timestamp():.2f} s" if sent_at else "-"
        lines.append(f"    slow: {key} committed at {commit - soak.started_at:.1f} s; to the broker {to_sent} "
                     f"(claimed {attempts} times), then to its effect {to_effect}")
    committed_times = sorted(outcome.committed.values())
    first_times = sorted(outcome.first_at.values())
    gaps = sorted(((later - earlier, earlier) for earlier, later in itertools.pairwise(outcome.created)
                   if later - earlier >= 1.0), reverse=True)
    for gap, at in gaps[:3]:
        waiting = outcome.open_at(at, committed_times, first_times)
        if waiting:
            lines.append(f"    no job finished for {gap:.1f} s from {at - soak.started_at:.1f} s with {waiting:,} "
                         f"jobs waiting")
    return lines


def report(soak: Soak, timings: dict[str, float]) -> bool:
    """Print the summary; True when nothing was lost, doubled when it must not be, or invented."""
    from django.db.models import Count, Sum

    from composition.jobs.models import BrokerEpoch, DeadLetter
    from composition.outbox import OutboxMessage
    from tests.jobsapp.models import Effect

    args, stats = soak.args, soak.publisher.stats
    outcome = collect(soak)
    committed, counts = outcome.committed, outcome.counts
    # A wipe's non-idempotent jobs are outside the promise (no ledger to reconcile them from).
    wiped = sorted(key for key in committed if key not in counts and key in soak.wiped_plain)
    lost = sorted(key for key in committed if key not in counts and key not in soak.wiped_plain)
    phantoms = sorted(key for key in counts if key not in committed)
    doubled = {kind: sorted(key for key, n in counts.items() if n > 1 and kind_of(key) == kind)
               for kind in (IDEMPOTENT, PLAIN)}
    extra = {kind: sum(counts[key] - 1 for key in keys) for kind, keys in doubled.items()}
    pending = db_call(lambda: OutboxMessage.objects.filter(status="pending").count())
    backlog = broker_backlog(soak.client, soak.queues)
    dead = Counter(db_call(lambda: list(DeadLetter.objects.values_list("actor", flat=True))))

    kills = sum(1 for fault in soak.faults if fault.kind.endswith("kill"))
    relay_kills = [fault for fault in soak.faults if fault.kind == "relay kill"]
    caught = sum(1 for fault in relay_kills if "NOT caught" not in fault.note)
    for fault in soak.faults:
        if fault.kind == "host blackhole":
            after = db_call(lambda fault=fault: Effect.objects.filter(
                host="b", created_at__gt=datetime.fromtimestamp(fault.done_at, UTC)).count())
            fault.note += f"; {after:,} jobs after it was let back" if after else "; did NOT work again after it"
    print()
    print(f"chaos soak: {args.jobs:,} idempotent + {args.jobs:,} non-idempotent jobs; "
          f"{kills} kills ({caught} of {len(relay_kills)} relay kills caught the relay mid-batch), "
          f"{sum(f.kind == 'broker restart' for f in soak.faults)} broker restart(s), "
          f"{sum(f.kind == 'postgres restart' for f in soak.faults)} PostgreSQL restart(s), "
          f"{sum(f.kind == 'broker wipe' for f in soak.faults)} broker wipe(s), "
          f"{sum(f.kind == 'host blackhole' for f in soak.faults)} host blackhole(s)")
    print(f"  runworkers {' '.join(soak.worker_args)}; {_settings_line()}")
    if soak.remote_workers:
        print(f"  host b: runworkers {' '.join(soak.remote_args)} through fault proxies, "
              + ", ".join(f"{proxy.host}:{proxy.port} to {proxy.target[1]}" for proxy in soak.proxies))
    print(f"  published {len(committed):,} of {soak.planned:,} jobs in {stats.transactions:,} transactions: "
          f"{stats.attempts:,} attempts, {stats.failed_attempts} failed and retried, "
          f"{stats.commits_looked_up} failed COMMITs looked up afterwards; at most "
          f"{soak.publisher.max_backlog:,} published and not done outside the bursts")
    print("faults (seconds since the first publish; recovery measured from the start of each fault):")
    print("\n".join(fault_lines(soak, outcome)))
    if soak.stalled:
        print(f"  STALLED: {soak.stalled}")

    print("result:")
    print(f"  lost jobs: {len(lost)} of {len(committed):,} published "
          f"(no effect {args.recovery_deadline_s:.0f} s after the last fault or publish)")
    print(f"  duplicate effects, idempotent: {len(doubled[IDEMPOTENT])} jobs ({extra[IDEMPOTENT]} extra effects)")
    print(f"  duplicate effects, non-idempotent: {len(doubled[PLAIN])} jobs ({extra[PLAIN]} extra effects; "
          f"allowed, counted)")
    print(f"  effects of jobs never published: {len(phantoms)}")
    if args.broker_wipes:
        losses = db_call(lambda: BrokerEpoch.objects.filter(lost=True).aggregate(n=Count("id"), resent=Sum("resent")))
        print(f"  broker data lost: {losses['n']} loss(es) detected, {losses['resent'] or 0:,} outbox rows sent again "
              f"(idempotent jobs, after their {soak.window_s:.0f} s redelivery window); non-idempotent jobs lost with "
              f"it: {len(wiped)} of {len(soak.wiped_plain)} on it (outside the promise: no ledger to tell what ran)")
    print(f"  dead letters: {sum(dead.values())}{f' {dict(dead)}' if dead else ''}")
    queues = "; ".join(f"{queue} ready {q['ready']} held {q['held']} delayed {q['delayed']} dead {q['dead']}"
                       for queue, q in backlog.items())
    print(f"  backlog at the end: outbox pending {pending}; broker {queues}")
    print("\n".join(latency_lines(soak, outcome)))
    for at, host, code, last_line in soak.exits:
        print(f"  runworkers (host {host}) exited by itself at {at - soak.started_at:.1f} s with {code} (restarted): "
              f"{last_line}")
    print(f"  the last runworkers drained and exited with {soak.final_exit_code}"
          + (f"; host b's with {soak.remote_exit_code}" if soak.remote_workers else ""))
    print(f"  took {timings['total']:.1f} s: servers and migrations {timings['setup']:.1f} s, soak "
          f"{timings['soak']:.1f} s (final drain {soak.drained_at - soak.deadline_from:.1f} s after the last fault "
          f"or publish); {len(committed) / max(timings['soak'], 1e-9):,.0f} jobs/s")
    if lost:
        print(describe_lost(soak, lost[:10]))
    for kind in (IDEMPOTENT, PLAIN):
        if doubled[kind]:
            print(f"  {kind} jobs with more than one effect (first 10): "
                  + ", ".join(f"{key} x{counts[key]}" for key in doubled[kind][:10]))
    if phantoms:
        print(f"  effects without a committed publish (first 10): {', '.join(phantoms[:10])}")
    ok = not lost and not doubled[IDEMPOTENT] and not phantoms
    print("PASS" if ok else "FAIL")
    return ok


def describe_lost(soak: Soak, keys: list[str]) -> str:
    """Where each lost job got to: its outbox row, the broker, the inbox ledger, dead letters."""
    from composition.jobs.models import DeadLetter, ProcessedMessage
    from composition.outbox import OutboxMessage

    in_broker: dict[str, list[str]] = {}
    for queue in soak.queues:
        for suffix in (".msgs", ".DQ.msgs", ".XQ.msgs"):
            for raw in soak.client.hvals(f"dramatiq:{queue}{suffix}"):
                kwargs = json.loads(raw).get("kwargs", {})
                if kwargs.get("key") in keys:
                    in_broker.setdefault(kwargs["key"], []).append(queue + suffix)
    lines = ["  lost jobs (first 10):"]
    for key in keys:
        rows = db_call(lambda key=key: list(OutboxMessage.objects.filter(payload__key=key)))
        letters = db_call(lambda key=key: DeadLetter.objects.filter(payload__key=key).count())
        for row in rows:
            ledger = db_call(lambda row=row: ProcessedMessage.objects.filter(message_id=row.message_id).exists())
            sent = f"{row.sent_at.timestamp() - soak.started_at:.1f} s" if row.sent_at else "never"
            lines.append(f"    {key}: outbox #{row.pk} {row.status}, claimed {row.attempts} times (last by "
                         f"{row.claimed_by!r}), sent at {sent}, last error {row.last_error[:120]!r}; stored in the "
                         f"broker: {', '.join(in_broker.get(key, [])) or 'no'}; inbox ledger row: {ledger}; "
                         f"dead letters: {letters}")
        if not rows:
            lines.append(f"    {key}: no outbox row (the publisher believed it committed)")
    return "\n".join(lines)


def _settings_line() -> str:
    from composition.conf import conf

    return (f"lease {conf.OUTBOX_LEASE_S} s, broker heartbeat timeout {conf.BROKER_HEARTBEAT_TIMEOUT_S} s, "
            f"broker loss check {conf.BROKER_LOSS_CHECK_INTERVAL_S} s, "
            f"sweep {conf.OUTBOX_SWEEP_INTERVAL_S} s")


# -- set-up and tear-down ----------------------------------------------------------------------------------------
def _log_to(path: Path) -> None:
    """This process's logs (the publisher's relay warnings during outages) go to ``path``."""
    import logging

    root = logging.getLogger()
    formatter = root.handlers[0].formatter if root.handlers else None
    handler = logging.FileHandler(path)
    handler.setFormatter(formatter)
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)


def _stop_on_sigterm() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _stop_on_sigterm()
    began = time.monotonic()
    log_dir = Path(tempfile.mkdtemp(prefix="chaos-"))
    redis_server: ThrowawayRedis | None = None
    postgres: ThrowawayPostgres | None = None
    bouncer: ThrowawayPgBouncer | None = None
    seen_before: dict[str, Any] = {}
    soak: Soak | None = None
    ok = False
    try:
        redis_server = ThrowawayRedis(appendonly=True, appendfsync="always").start()
        postgres = ThrowawayPostgres("chaos").start()
        postgres.migrate(SETTINGS_MODULE, cwd=str(ROOT))
        database_url, settings_module = postgres.url, SETTINGS_MODULE
        if args.pgbouncer:
            # server_login_retry as docs/deployment.md advises: PgBouncer's 15 s default is how long
            # it would wait after PostgreSQL came back before trying it again.
            bouncer = ThrowawayPgBouncer("127.0.0.1", postgres.port, pool_size=args.pgbouncer,
                                         server_login_retry=1).start()
            database_url, settings_module = bouncer.url(postgres.database), POOLED_SETTINGS_MODULE
        os.environ.update({
            "DATABASE_URL": database_url, "REDIS_URL": redis_server.url, "BROKER_URL": redis_server.url,
            "DJANGO_SETTINGS_MODULE": settings_module,
            "COMPOSITION_TEST_OVERRIDES": json.dumps({
                **json.loads(os.environ.get("COMPOSITION_TEST_OVERRIDES") or "{}"), **json.loads(args.overrides)}),
        })
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the workers must not share a caller's directory
        import django

        django.setup()
        if bouncer is not None:
            from tests.helpers import session_seen

            give_the_role_its_timeouts(postgres)
            seen_before = session_seen(database_url)
        _log_to(log_dir / "publisher.log")
        setup_s = time.monotonic() - began
        print(f"chaos soak: {args.jobs:,} + {args.jobs:,} jobs, {args.kills} kills, {args.broker_restarts} broker "
              f"and {args.postgres_restarts} PostgreSQL restart(s), {args.broker_wipes} broker wipe(s), "
              f"{args.host_blackholes} host blackhole(s); servers up and migrated in {setup_s:.1f} s", flush=True)
        print(f"  private servers: {postgres.url} {redis_server.url}; logs in {log_dir}", flush=True)
        if bouncer is not None:
            print(f"  every process through PgBouncer (pool_mode=transaction, {args.pgbouncer} server "
                  f"connections): {database_url}", flush=True)
        soak = Soak(args, redis_server, postgres, log_dir)
        if soak.proxies:
            print(f"  host b through fault proxies: {soak.remote_env['DATABASE_URL']} {soak.remote_env['BROKER_URL']}",
                  flush=True)
        soak_began = time.monotonic()
        soak.run()
        soak_s = time.monotonic() - soak_began
        ok = report(soak, {"setup": setup_s, "soak": soak_s, "total": time.monotonic() - began})
        if bouncer is not None:
            ok = report_pooler(bouncer, postgres, seen_before) and ok
        return 0 if ok else 1
    except KeyboardInterrupt:
        print("interrupted; stopping everything", flush=True)
        return 2
    except Exception:
        traceback.print_exc()
        print("the soak could not run to the end; stopping everything", flush=True)
        return 2
    finally:
        _tear_down(soak, redis_server, postgres, bouncer, log_dir, keep=not ok or args.keep_logs)


def give_the_role_its_timeouts(postgres: ThrowawayPostgres) -> None:
    """Behind the pooler the library sets no session setting: the role gets the timeouts, once, on
    a direct connection (docs/deployment.md, 'Behind PgBouncer')."""
    import psycopg

    from composition.db.pooling import timeout_statements

    with psycopg.connect(postgres.url, autocommit=True) as direct:
        for statement in timeout_statements("default"):
            direct.execute(statement)


def report_pooler(bouncer: ThrowawayPgBouncer, postgres: ThrowawayPostgres, before: dict[str, Any]) -> bool:
    """Print what went through the pooler; True when a client that set nothing sees what one saw
    before the soak (the role's settings, no advisory lock): nothing the library left behind."""
    import psycopg
    import psycopg.rows

    from tests.helpers import session_seen

    with psycopg.connect(bouncer.url("pgbouncer"), autocommit=True, prepare_threshold=None) as console:
        cursor = console.cursor(row_factory=psycopg.rows.dict_row)
        stats = {row["database"]: row for row in cursor.execute("SHOW STATS").fetchall()}[postgres.database]
        pool = {row["database"]: row for row in cursor.execute("SHOW POOLS").fetchall()}[postgres.database]
    after = session_seen(bouncer.url(postgres.database))
    servers = sum(pool[state] for state in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login"))
    print(f"pgbouncer: {stats['total_xact_count']:,} transactions, {stats['total_query_count']:,} queries through "
          f"it; {servers} of {bouncer.pool_size} server connections open at the end; a client that set nothing "
          f"sees {after}: {'as before the soak' if after == before else f'NOT as before the soak {before}'}")
    return after == before


def _tear_down(soak: Soak | None, redis_server: ThrowawayRedis | None, postgres: ThrowawayPostgres | None,
               bouncer: ThrowawayPgBouncer | None, log_dir: Path, *, keep: bool) -> None:
    """Stop everything the soak started, each step on its own (one failing does not skip the rest);
    keep the logs in ``log_dir`` when ``keep``, else remove them."""

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the tear-down short

    def quietly(step: Callable[[], object]) -> None:
        try:
            step()
        except Exception as exc:
            print(f"tear-down: {type(exc).__name__}: {exc}", flush=True)

    if soak is not None:
        soak.publisher.stopping.set()
        soak.publisher.resume()
        for worker in [*soak.workers, *soak.remote_workers]:
            quietly(worker.crash)
            if keep:  # before close(), which deletes it
                quietly(lambda worker=worker: shutil.copy(worker.log_path, log_dir / worker.log_path.name))
            quietly(worker.close)

    def close_connections() -> None:
        from django.conf import settings
        from django.db import connections

        if settings.configured:
            connections.close_all()

    quietly(close_connections)
    for proxy in soak.proxies if soak is not None else []:
        quietly(proxy.close)
    if redis_server is not None:
        if keep:
            quietly(lambda: shutil.copy(redis_server.data_dir / "valkey.log", log_dir / "valkey.log"))
        quietly(redis_server.close)
    if bouncer is not None:
        if keep:
            quietly(lambda: (log_dir / "pgbouncer.log").write_text(bouncer.log()))
        quietly(bouncer.close)
    if postgres is not None:
        if keep:
            quietly(lambda: shutil.copy(postgres.pgdata.parent / "postgres.log", log_dir / "postgres.log"))
        quietly(postgres.close)
    if keep:
        print(f"logs kept in {log_dir}", flush=True)
    else:
        shutil.rmtree(log_dir, ignore_errors=True)

if __name__ == "__main__":
    sys.exit(main())
