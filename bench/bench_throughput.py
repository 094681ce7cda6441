"""End-to-end job throughput through the outbox, against naive Dramatiq.

5,000 jobs per run, published 100 per transaction; the rate runs from the first commit to the
last job body. Two workers run side by side all along, each 1 process x 8 threads on the Redis
broker: one real ``runworkers``, and Dramatiq's own CLI on ``bench/_naive_dramatiq.py`` (a plain
``RedisBroker``, Dramatiq's default middleware plus django_dramatiq's ``DbConnectionsMiddleware``:
the "bench" extra). On a small machine the publisher, the workers, PostgreSQL and Redis share
the CPU, so CPU per job is printed beside the rate: the publisher's (this process, publishing
only), the worker's (the worker's process tree, while its contender runs), and PostgreSQL's and
Redis's (each server's process tree, found by the port it listens on; a line of its own, and
"n/a" when the server is not a TCP listener this user can read, as embedded PostgreSQL on a
Unix socket is not): together, the machine's CPU per job, which bounds the rate once the cores
are busy. ``runworkers``
consumes the bench's queue and the outbox relay's only, as the naive worker consumes its own (as
``bench_workers.py`` gives ``--queues``).

- naive dramatiq: ``transaction.on_commit(lambda: naive_stamp.send(...))`` 100 times, run by the
  ``dramatiq`` CLI (the same job body as ``bench_stamp``): the baseline of the goals;
- naive dramatiq + ledger: the same with the inbox ledger's row written by hand in the job's
  transaction (as ``bench_stamp_idempotent`` does): what ``idempotent=True``'s durable work costs
  on plain Dramatiq, printed beside ours;
- hand-written outbox, and hand-written outbox + ledger: the durable work of ``publish()`` done
  by hand around naive Dramatiq (each job's row INSERTed into the outbox table in the
  transaction, sent after COMMIT, then all marked sent with one UPDATE), run by the ``dramatiq``
  CLI without and with the ledger: what the durability itself costs on the same cores, the
  reference that says how much of a gap to naive is the library's own;
- on_commit: the same publishing, of ``bench_stamp``, run by ``runworkers``;
- outbox: ``publish(bench_stamp, ...)`` 100 times in one transaction;
- outbox publish_many: ``publish_many(bench_stamp, [...])`` once per transaction;
- outbox idempotent: the same job under the inbox ledger (a database commit per job);
- the same with a database effect: ``bench_effect`` (one row in its own transaction) on the
  on_commit path against ``bench_effect`` and ``bench_effect_idempotent`` (the row and the
  ledger row in one commit) through the outbox.

Every contender runs once per round, in an order that rotates, for ``BENCH_ROUNDS`` rounds
(default 5) after a short warm-up round; medians over the rounds are printed. The tables the
runs churn are vacuumed after each run (the bench's PostgreSQL may run without autovacuum).

Goals (issue 30): the outbox's rate >= 1.0x naive Dramatiq's for plain jobs and >= 0.9x for
``idempotent=True``, the worker's CPU per plain job <= naive Dramatiq's, and ``publish_many``'s
publish rate (jobs committed per second of publishing) >= 1.2x naive Dramatiq's; with a database
effect, ``idempotent=True`` through the outbox >= 0.8x on_commit (issue 9). Exit status 1 when
a goal is missed. The outbox's contenders are also printed against the hand-written outbox
(with the ledger for ``idempotent=True``), which has no goal: it prices the durable work.
Run: ``python bench/bench_throughput.py`` (env BENCH_JOBS, default 5000; BENCH_ROUNDS, default 5;
BENCH_CONTENDERS, a comma-separated subset of the names above, naive dramatiq always included:
"outbox" alone measures the worker's CPU per plain job against naive's in a third of the time;
BENCH_PROCESSES, default 1: worker processes of both workers, the goals' setting being 1).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("LOG_LEVEL", "WARNING")
from _util import setup_django  # noqa: E402

setup_django("tests.settings")

import psutil  # noqa: E402
import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from composition.broker.configured import configured_broker  # noqa: E402
from composition.jobs.models import ProcessedMessage  # noqa: E402
from composition.outbox import OutboxMessage, publish, publish_many  # noqa: E402
from composition.outbox.relay import RELAY_QUEUE_NAME  # noqa: E402
from tests.jobsapp import jobs  # noqa: E402
from tests.jobsapp.models import Effect  # noqa: E402

try:
    import _naive_dramatiq as naive  # needs the "bench" extra (django_dramatiq)
except ImportError as exc:
    raise SystemExit(f"bench_throughput needs the bench extra (pip install -e '.[bench]'): {exc}") from exc

JOBS = int(os.environ.get("BENCH_JOBS", "5000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
WARM_UP_JOBS = 300
PER_TRANSACTION = 100
THREADS = 8
PROCESSES = int(os.environ.get("BENCH_PROCESSES", "1"))
RUN_TIMEOUT_S = 300.0
NAIVE = "naive dramatiq"
# What runworkers consumes: the bench's queue and the outbox relay's, as the naive worker consumes
# its one queue (tests.settings declares two dozen test queues, whose idle polling would be
# counted against these jobs).
RUNWORKERS_QUEUES = (jobs.BENCH_QUEUE, RELAY_QUEUE_NAME)
# Rate goals: name -> (goal, baseline's name).
RATE_GOALS = {"outbox": (1.0, NAIVE), "outbox idempotent": (0.9, NAIVE),
              "outbox idempotent + db effect": (0.8, "on_commit + db effect")}
# Publish rate goals (jobs committed per second of publishing): name -> (goal, baseline's name).
PUBLISH_RATE_GOALS = {"outbox publish_many": (1.2, NAIVE)}
# Worker CPU per job goals: name -> (at most this many times the baseline's, baseline's name).
WORKER_CPU_GOALS = {"outbox": (1.0, NAIVE)}
NAIVE_LEDGER = "naive dramatiq + ledger"
HAND_OUTBOX = "hand-written outbox"
HAND_OUTBOX_LEDGER = "hand-written outbox + ledger"
# Printed for the breakdown, without a goal.
BASELINES = {"on_commit": NAIVE, NAIVE_LEDGER: NAIVE, HAND_OUTBOX: NAIVE, HAND_OUTBOX_LEDGER: NAIVE,
             "outbox + db effect": "on_commit + db effect"}
# A second comparison, like with like: the same durable work on plain Dramatiq.
REFERENCES = {"outbox": [HAND_OUTBOX], "outbox idempotent": [NAIVE_LEDGER, HAND_OUTBOX_LEDGER]}


@dataclass(frozen=True)
class Contender:
    name: str
    send: Callable[[range], None]  # publishes the jobs of these seqs, inside one transaction
    worker: str  # "runworkers" or "naive"
    # Writes a ledger row per job, committed after the job's stamp: the run waits for the rows, so
    # that the clean-up after it deletes them all (a row committed after it would make the next
    # run's job of that seq a "processed already" skip, and the run would wait for it in vain).
    ledger: bool = False


def outbox(actor: Any) -> Callable[[range], None]:
    def send(seqs: range) -> None:
        for seq in seqs:
            publish(actor, {"seq": seq})
    return send


def on_commit(actor: Any) -> Callable[[range], None]:
    def send(seqs: range) -> None:
        for seq in seqs:
            transaction.on_commit(lambda seq=seq: actor.send(seq=seq))
    return send


# The columns a hand-written outbox row needs in the outbox table (the others may be NULL).
_HAND_INSERT = ("INSERT INTO {table} (actor_name, queue_name, payload, headers, status, created_at, claimed_by,"
                " attempts, last_error) VALUES (%s, %s, %s::jsonb, '{{}}', 'pending', now(), '', 0, '') RETURNING id")
_HAND_MARK = "UPDATE {table} SET status = 'sent', sent_at = now() WHERE id = ANY(%s)"


def hand_outbox(actor: Any) -> Callable[[range], None]:
    def send(seqs: range) -> None:
        table = connection.ops.quote_name(OutboxMessage._meta.db_table)
        ids = []
        with connection.cursor() as cursor:
            for seq in seqs:
                cursor.execute(_HAND_INSERT.format(table=table), [actor.actor_name, naive.NAIVE_QUEUE,
                                                                  json.dumps({"seq": seq})])
                ids.append(cursor.fetchone()[0])

        def send_and_mark() -> None:
            for seq in seqs:
                actor.send(seq=seq)
            with connection.cursor() as cursor:
                cursor.execute(_HAND_MARK.format(table=table), [ids])

        transaction.on_commit(send_and_mark)
    return send


CONTENDERS = [
    Contender(NAIVE, on_commit(naive.naive_stamp), "naive"),
    Contender(NAIVE_LEDGER, on_commit(naive.naive_ledger_stamp), "naive", ledger=True),
    Contender(HAND_OUTBOX, hand_outbox(naive.naive_stamp), "naive"),
    Contender(HAND_OUTBOX_LEDGER, hand_outbox(naive.naive_ledger_stamp), "naive", ledger=True),
    Contender("on_commit", on_commit(jobs.bench_stamp), "runworkers"),
    Contender("outbox", outbox(jobs.bench_stamp), "runworkers"),
    Contender("outbox publish_many", lambda seqs: publish_many(jobs.bench_stamp, [{"seq": seq} for seq in seqs]),
              "runworkers"),
    Contender("outbox idempotent", outbox(jobs.bench_stamp_idempotent), "runworkers", ledger=True),
    Contender("on_commit + db effect", on_commit(jobs.bench_effect), "runworkers"),
    Contender("outbox + db effect", outbox(jobs.bench_effect), "runworkers"),
    Contender("outbox idempotent + db effect", outbox(jobs.bench_effect_idempotent), "runworkers",
              ledger=True),
]

if os.environ.get("BENCH_CONTENDERS"):
    _chosen = {name.strip() for name in os.environ["BENCH_CONTENDERS"].split(",") if name.strip()}
    _unknown = _chosen - {contender.name for contender in CONTENDERS}
    if _unknown:
        sys.exit(f"BENCH_CONTENDERS names no contender: {', '.join(sorted(_unknown))}")
    CONTENDERS = [contender for contender in CONTENDERS if contender.name in _chosen | {NAIVE}]


def tree_cpu_s(process: psutil.Process) -> float:
    """User and system CPU seconds of ``process`` and its children so far."""
    total = 0.0
    for member in [process, *process.children(recursive=True)]:
        try:
            total += sum(member.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def listener(port: int) -> psutil.Process | None:
    """The process listening on TCP ``port`` on this machine, if this user may see it."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return psutil.Process(conn.pid)
    except psutil.Error:
        pass
    return None


def servers() -> dict[str, psutil.Process]:
    """PostgreSQL's postmaster and the Redis server, by the ports the bench connects to. The
    postmaster's tree holds every connection's backend: the workers' and the publisher's stay
    open through the runs."""
    loopback = ("127.", "localhost", "::1")
    found = {}
    database = settings.DATABASES["default"]
    if str(database.get("HOST") or "").startswith(loopback):
        found["PostgreSQL"] = listener(int(database.get("PORT") or 5432))
    cache = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"]).connection_pool.connection_kwargs
    if str(cache.get("host", "")).startswith(loopback) and "port" in cache:  # not a Unix socket
        found["Redis"] = listener(int(cache["port"]))
    return {name: process for name, process in found.items() if process is not None}


def vacuum() -> None:
    """The tables the runs churn, vacuumed: deleted rows otherwise stay for the next runs' inserts
    and index scans to wade through."""
    with connection.cursor() as cursor:
        for model in (OutboxMessage, ProcessedMessage, Effect):
            cursor.execute(f"VACUUM {connection.ops.quote_name(model._meta.db_table)}")


def clean_up() -> None:
    OutboxMessage.objects.filter(queue_name__in=[jobs.BENCH_QUEUE, naive.NAIVE_QUEUE]).delete()
    ProcessedMessage.objects.filter(actor__startswith="bench_").delete()  # naive.LEDGER_ACTOR's too
    Effect.objects.filter(key__startswith="bench-effect-").delete()
    vacuum()


def run(contender: Contender, jobs_count: int, client: redis.Redis, worker: psutil.Process,
        watched: dict[str, psutil.Process]) -> dict[str, float]:
    client.delete(jobs.BENCH_STAMPS_KEY)
    worker_cpu = tree_cpu_s(worker)
    server_cpu = {name: tree_cpu_s(process) for name, process in watched.items()}
    publisher_cpu = 0.0
    began = time.time()
    for start in range(0, jobs_count, PER_TRANSACTION):
        cpu = time.process_time()
        with transaction.atomic():
            contender.send(range(start, min(jobs_count, start + PER_TRANSACTION)))
        publisher_cpu += time.process_time() - cpu
    published = time.time()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while (done := client.llen(jobs.BENCH_STAMPS_KEY)) < jobs_count:
        if time.monotonic() > deadline:
            raise SystemExit(f"{contender.name}: only {done} of {jobs_count} jobs ran")
        time.sleep(0.02)
    while contender.ledger and ProcessedMessage.objects.filter(actor__startswith="bench_").count() < jobs_count:
        if time.monotonic() > deadline:
            raise SystemExit(f"{contender.name}: the ledger rows of its {jobs_count} jobs did not all commit")
        time.sleep(0.02)
    worker_s = tree_cpu_s(worker) - worker_cpu
    servers_ms = {f"{name}_ms": (tree_cpu_s(process) - server_cpu[name]) / jobs_count * 1000
                  for name, process in watched.items()}
    last = max(float(raw.split()[1]) for raw in client.lrange(jobs.BENCH_STAMPS_KEY, 0, -1))
    return {"rate": jobs_count / (last - began), "publish_rate": jobs_count / (published - began),
            "publisher_ms": publisher_cpu / jobs_count * 1000,
            "worker_ms": worker_s / jobs_count * 1000, **servers_ms}


def start(argv: list[str], env: dict[str, str], log: TextIO) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the worker's main process (Dramatiq's CLI passes it on to its worker process; a
    second one there would kill it), SIGKILL to its whole session if it does not stop."""
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def report(results: dict[str, list[dict[str, float]]]) -> list[str]:
    """Print the medians with their ratios and verdicts; the names of the goals missed."""
    medians = {name: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
               for name, runs in results.items()}
    missed = []
    for name, median in medians.items():
        notes = []
        rate_goal, rate_baseline = RATE_GOALS.get(name, (None, BASELINES.get(name)))
        if rate_baseline in medians:
            ratio = median["rate"] / medians[rate_baseline]["rate"]
            note = f"rate {ratio:.2f}x {rate_baseline}"
            if rate_goal is not None:
                note += f" (goal >= {rate_goal}x: {'met' if ratio >= rate_goal else 'MISSED'})"
                if ratio < rate_goal:
                    missed.append(f"{name} rate")
            notes.append(note)
        if name in PUBLISH_RATE_GOALS and PUBLISH_RATE_GOALS[name][1] in medians:
            publish_goal, publish_baseline = PUBLISH_RATE_GOALS[name]
            ratio = median["publish_rate"] / medians[publish_baseline]["publish_rate"]
            notes.append(f"publish rate {ratio:.2f}x {publish_baseline} "
                         f"(goal >= {publish_goal}x: {'met' if ratio >= publish_goal else 'MISSED'})")
            if ratio < publish_goal:
                missed.append(f"{name} publish rate")
        for reference in REFERENCES.get(name, ()):
            if reference in medians:
                notes.append(f"rate {median['rate'] / medians[reference]['rate']:.2f}x, worker CPU "
                             f"{median['worker_ms'] / medians[reference]['worker_ms']:.2f}x {reference}")
        if name != NAIVE:
            ratio = median["worker_ms"] / medians[NAIVE]["worker_ms"]
            note = f"worker CPU {ratio:.2f}x {NAIVE}"
            if name in WORKER_CPU_GOALS:
                cpu_goal, cpu_baseline = WORKER_CPU_GOALS[name]
                ratio = median["worker_ms"] / medians[cpu_baseline]["worker_ms"]
                note += f" (goal <= {cpu_goal}x: {'met' if ratio <= cpu_goal else 'MISSED'})"
                if ratio > cpu_goal:
                    missed.append(f"{name} worker CPU")
            notes.append(note)
        print(f"{name:>28}: {median['rate']:7,.0f} jobs/s (published {median['publish_rate']:7,.0f}/s), "
              f"publisher CPU {median['publisher_ms']:.3f} ms/job, "
              f"worker CPU {median['worker_ms']:.3f} ms/job" + ("; " + "; ".join(notes) if notes else ""))
    print_machine_cpu(medians)
    return missed


def print_machine_cpu(medians: dict[str, dict[str, float]]) -> None:
    """CPU per job of every process a run keeps busy, and their sum: on a machine whose cores are
    all busy, the rate is about the cores over that sum, whoever spends it."""
    print("CPU ms/job across the machine (publisher + worker + servers = total):")
    for name, median in medians.items():
        parts = [("publisher", median["publisher_ms"]), ("worker", median["worker_ms"])]
        for server in ("PostgreSQL", "Redis"):
            parts.append((server, median.get(f"{server}_ms")))
        known = [ms for _, ms in parts if ms is not None]
        cells = ", ".join(f"{label} {ms:.3f}" if ms is not None else f"{label} n/a" for label, ms in parts)
        total = f"{sum(known):.3f}" + ("" if len(known) == len(parts) else " (servers not all seen)")
        print(f"{name:>30}: {cells}; total {total}")


def main() -> int:
    assert naive.STAMPS_KEY == jobs.BENCH_STAMPS_KEY, "the naive job must stamp where bench_stamp does"
    assert ProcessedMessage._meta.db_table == naive.LEDGER_TABLE and naive.LEDGER_ACTOR.startswith("bench_")
    broker = configured_broker()
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    for queue in (jobs.BENCH_QUEUE, RELAY_QUEUE_NAME):
        broker.flush(queue)
    naive.broker.flush(naive.NAIVE_QUEUE)
    clean_up()

    log = tempfile.NamedTemporaryFile(prefix="bench-throughput-", suffix=".log", delete=False, mode="w")  # noqa: SIM115
    workers: dict[str, subprocess.Popen[bytes]] = {}
    cleanups: list[str] = []  # directories to remove at the end
    results: dict[str, list[dict[str, float]]] = {contender.name: [] for contender in CONTENDERS}
    try:
        # Several processes serve /metrics from one multiprocess directory (runworkers refuses without).
        metrics_dir = {"PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp(prefix="bench-throughput-metrics-")} \
            if PROCESSES > 1 else {}
        cleanups.extend(metrics_dir.values())
        workers["runworkers"] = start(
            [sys.executable, str(ROOT / "manage.py"), "runworkers", "--processes", str(PROCESSES), "--threads",
             str(THREADS), "--queues", ",".join(RUNWORKERS_QUEUES)],
            {**os.environ, **metrics_dir}, log)
        workers["naive"] = start(
            [str(Path(sys.executable).parent / "dramatiq"), "bench._naive_dramatiq:broker", "--processes",
             str(PROCESSES), "--threads", str(THREADS)],
            {**os.environ, "DJANGO_SETTINGS_MODULE": "bench._naive_settings"}, log)
        processes = {kind: psutil.Process(process.pid) for kind, process in workers.items()}
        watched = servers()
        time.sleep(3)  # past Django's start-up
        for contender in CONTENDERS:  # warm-up: connections, caches, the first fetches
            run(contender, WARM_UP_JOBS, client, processes[contender.worker], watched)
            clean_up()
        for round_index in range(ROUNDS):
            shift = round_index % len(CONTENDERS)
            for contender in CONTENDERS[shift:] + CONTENDERS[:shift]:
                results[contender.name].append(run(contender, JOBS, client, processes[contender.worker], watched))
                clean_up()
    finally:
        for process in workers.values():
            stop(process)
        log.close()
        client.delete(jobs.BENCH_STAMPS_KEY)
        for directory in cleanups:
            shutil.rmtree(directory, ignore_errors=True)

    print(f"{JOBS} jobs, {PER_TRANSACTION} per transaction, {PROCESSES} process(es) x {THREADS} threads per "
          f"worker, Redis broker; medians of {ROUNDS} interleaved rounds")
    missed = report(results)
    print(f"workers' log: {log.name}")
    if missed:
        print("MISSED: " + ", ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
