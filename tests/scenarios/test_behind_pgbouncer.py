"""Workers behind PgBouncer in transaction mode, with fewer server connections than threads: a
SIGKILL storm leaves every idempotent effect exactly once, and the pooler's next client then sees
the server's defaults and no lock (issue #38; each test starts its own PgBouncer)."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import psycopg.rows
import pytest
from django.db import connection, transaction
from django.db.models import Count

from composition.jobs.models import DeadLetter, ProcessedMessage
from composition.outbox import OutboxMessage, publish
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.testing import current_database_url, empty_queues, wait_until
from tests.helpers import pgbouncer_in_front, require_pgbouncer, session_seen
from tests.jobsapp import jobs
from tests.jobsapp.models import Effect

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True),
              pytest.mark.empty_queues(jobs.CRASH_QUEUE, RELAY_QUEUE_NAME)]

THREADS = 8
POOL_SIZE = 3  # fewer server connections than threads: the pooler queues the rest


def test_a_sigkill_storm_through_the_pooler_leaves_every_effect_once_and_nothing_behind(worker_processes: Any) -> None:
    require_pgbouncer()
    total, kills = 400, 2
    defaults = session_seen(current_database_url())
    with transaction.atomic():
        for index in range(total):
            publish(jobs.crash_effect, {"key": f"b{index}"})
    with pgbouncer_in_front(pool_size=POOL_SIZE) as bouncer:
        url = bouncer.url(connection.settings_dict["NAME"])
        env = {"DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.settings_pgbouncer"}
        args = ["--threads", str(THREADS), "--queues", f"{jobs.CRASH_QUEUE},{RELAY_QUEUE_NAME}"]
        for _ in range(kills):
            worker = worker_processes.spawn(args, **env)
            before = Effect.objects.count()
            wait_until(lambda b=before: Effect.objects.count() >= b + 40, timeout_s=60,
                       message=f"no progress through the pooler; log:\n{worker.output()[-3000:]}\n"
                               f"{bouncer.log()[-2000:]}")
            worker.kill_group()
        worker = worker_processes.spawn(args, **env)
        wait_until(lambda: not OutboxMessage.objects.filter(status="pending").exists()
                   and Effect.objects.values("key").distinct().count() == total, timeout_s=60, interval_s=0.5,
                   message=f"backlog not finished; log:\n{worker.output()[-3000:]}")
        assert worker.terminate() == 0
        seen = session_seen(url)  # the next client of the same pool
        with psycopg.connect(bouncer.url("pgbouncer"), autocommit=True, prepare_threshold=None) as console:
            cursor = console.cursor(row_factory=psycopg.rows.dict_row)
            stats = {row["database"]: row for row in cursor.execute("SHOW STATS").fetchall()}
            pools = {row["database"]: row for row in cursor.execute("SHOW POOLS").fetchall()}
    # The jobs' transactions went through the pooler, on at most POOL_SIZE server connections.
    database = connection.settings_dict["NAME"]
    assert stats[database]["total_xact_count"] >= total, stats[database]
    assert pools[database]["sv_active"] + pools[database]["sv_idle"] + pools[database]["sv_used"] <= POOL_SIZE
    counts = Effect.objects.filter(key__startswith="b").values("key").annotate(n=Count("id"))
    assert len(counts) == total
    assert [row for row in counts if row["n"] != 1] == [], "an effect ran twice"
    assert ProcessedMessage.objects.filter(actor="crash_effect").count() == total
    assert not DeadLetter.objects.filter(actor="crash_effect").exists()
    assert seen == defaults


# Three relays in one process through the pooler (2 server connections), as runworkers' relay
# threads would: each message on the broker once, each key's in publishing order.
RELAYS_AT_ONCE = """
import json, threading
from django.db import connections
from composition.broker.configured import configured_broker
from composition.outbox.relay import Relay
barrier = threading.Barrier(3)
relayed = {}
def run(name):
    relay = Relay(configured_broker(), batch_size=50, relay_id=name)
    try:
        barrier.wait(10)
        relayed[name] = relay.run_until_idle()
    finally:
        connections.close_all()
threads = [threading.Thread(target=run, args=(f"relay-{n}",)) for n in range(3)]
for thread in threads: thread.start()
for thread in threads: thread.join(120)
relayed["final"] = Relay(configured_broker(), relay_id="final").run_until_idle()
print(json.dumps(relayed))
"""


@pytest.mark.usefixtures("nudge_only")
@pytest.mark.empty_queues("outboxapp_probe")
def test_three_relays_through_the_pooler_send_each_message_once_in_key_order() -> None:
    import json
    import subprocess
    import sys
    from collections import Counter, defaultdict

    from composition.testing import subprocess_env
    from tests.outboxapp.helpers import enqueued

    require_pgbouncer()
    messages, keys = 1_000, 20
    specs = [None if seq % 5 == 0 else f"key-{seq % keys}" for seq in range(messages)]
    with transaction.atomic():
        ids = [publish("outboxapp_relay_probe", {"seq": seq}, key=key).pk for seq, key in enumerate(specs)]
    key_of = dict(zip(ids, specs, strict=True))
    with pgbouncer_in_front(pool_size=2) as bouncer:
        result = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", RELAYS_AT_ONCE],
            env=subprocess_env(DATABASE_URL=bouncer.url(connection.settings_dict["NAME"]),
                               DJANGO_SETTINGS_MODULE="tests.settings_pgbouncer"),
            capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr + bouncer.log()[-2000:]
    relayed = json.loads(result.stdout.strip().splitlines()[-1])
    assert sum(relayed.values()) == messages
    outbox_ids = [message.options["composition"]["outbox_id"] for message in enqueued("outboxapp_probe")]
    assert Counter(outbox_ids) == Counter(ids), "a message missing or sent twice"
    per_key: dict[str, list[int]] = defaultdict(list)
    for outbox_id in outbox_ids:
        if key_of[outbox_id] is not None:
            per_key[key_of[outbox_id]].append(outbox_id)
    assert all(sequence == sorted(sequence) for sequence in per_key.values()), "a key out of order"
    assert not OutboxMessage.objects.filter(status="pending").exists()


def _stamps(key: str) -> dict[int, float]:
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    return {int(seq): float(at) for seq, at in (entry.split() for entry in client.lrange(key, 0, -1))}


def _relayed_while_jobs_hold_the_pool(worker_processes: Any, *, threads: int, pool_size: int, hold_s: float
                                      ) -> tuple[float, float, float]:
    """``threads`` idempotent jobs hold their transactions ``hold_s`` through a pool of
    ``pool_size``; once all have started a message is published. Returns (its commit, its arrival
    on the broker, the first job's end), Unix times."""
    import redis
    from django.conf import settings

    from tests.outboxapp.helpers import enqueued

    redis.Redis.from_url(settings.CACHES["default"]["LOCATION"]).delete(jobs.POOL_STARTS_KEY, jobs.POOL_ENDS_KEY)
    empty_queues("outboxapp_probe")
    with pgbouncer_in_front(pool_size=pool_size) as bouncer:
        worker = worker_processes.spawn(
            ["--threads", str(threads), "--queues", f"{jobs.POOL_QUEUE},{RELAY_QUEUE_NAME}"],
            DATABASE_URL=bouncer.url(connection.settings_dict["NAME"]),
            DJANGO_SETTINGS_MODULE="tests.settings_pgbouncer")
        for seq in range(threads):
            jobs.holds_its_transaction.send(seq=seq, hold_s=hold_s)
        wait_until(lambda: len(_stamps(jobs.POOL_STARTS_KEY)) == threads, timeout_s=60,
                   message=f"the jobs did not start; log:\n{worker.output()[-3000:]}")
        with transaction.atomic():
            publish("outboxapp_relay_probe", {"seq": 0})
        committed = time.time()
        wait_until(lambda: enqueued("outboxapp_probe"), timeout_s=60, interval_s=0.05,
                   message=f"the message was not relayed; log:\n{worker.output()[-3000:]}\n{bouncer.log()[-2000:]}")
        relayed = time.time()
        wait_until(lambda: len(_stamps(jobs.POOL_ENDS_KEY)) == threads, timeout_s=60)
        assert worker.terminate() == 0
    return committed, relayed, min(_stamps(jobs.POOL_ENDS_KEY).values())


@pytest.mark.usefixtures("nudge_only")  # the worker's relay sends the message, not this process
@pytest.mark.empty_queues(jobs.POOL_QUEUE, RELAY_QUEUE_NAME, "outboxapp_probe")
def test_a_pool_one_over_the_job_threads_relays_while_every_thread_holds_a_long_transaction(
        worker_processes: Any) -> None:
    # The sizing rule (docs/deployment.md, manage.py system): a worker process can hold one server
    # connection per thread for a whole idempotent job, and its sweeper, lease renewals and other
    # background work need one more. With it, the sweep relays within its interval while every job
    # thread holds a connection; one short, and the sweep waits in the pooler's queue until a job
    # commits.
    require_pgbouncer()
    threads, hold_s = 2, 6.0
    committed, relayed, first_end = _relayed_while_jobs_hold_the_pool(
        worker_processes, threads=threads, pool_size=threads + 1, hold_s=hold_s)
    assert relayed < first_end, f"relayed {relayed - first_end:.2f} s after the first job ended"
    assert relayed - committed < hold_s / 2

    committed, relayed, first_end = _relayed_while_jobs_hold_the_pool(
        worker_processes, threads=threads, pool_size=threads, hold_s=hold_s)
    assert relayed >= first_end, f"relayed {first_end - relayed:.2f} s before the first job ended"


# A publisher through the pooler that dies right after its COMMIT, before its own send or nudge:
# its hook is registered first, so it runs first.
PUBLISH_AND_DIE = """
import os, signal
from django.db import transaction
from composition.outbox import publish
from tests.jobsapp import jobs
with transaction.atomic():
    transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
    for index in range({total}):
        publish(jobs.crash_effect, {{"key": f"c{{index}}"}})
"""


def test_a_publisher_killed_after_its_commit_and_three_runworkers_killed_in_turn_lose_nothing_through_the_pooler(
        worker_processes: Any) -> None:
    import subprocess
    import sys

    from composition.testing import subprocess_env

    require_pgbouncer()
    total, threads = 300, 4
    defaults = session_seen(current_database_url())
    with pgbouncer_in_front(pool_size=POOL_SIZE) as bouncer:
        env = {"DATABASE_URL": bouncer.url(connection.settings_dict["NAME"]),
               "DJANGO_SETTINGS_MODULE": "tests.settings_pgbouncer"}
        published = subprocess.run([sys.executable, "manage.py", "shell", "-c", PUBLISH_AND_DIE.format(total=total)],
                                   env=subprocess_env(**env), capture_output=True, text=True, timeout=60)
        assert published.returncode == -9, published.stdout + published.stderr
        assert OutboxMessage.objects.filter(status="pending").count() == total, "the commit did not land"
        # Scale-out: three runworkers processes, 12 threads through 3 server connections; each is
        # SIGKILLed in turn once it made progress, and started again.
        args = ["--threads", str(threads), "--queues", f"{jobs.CRASH_QUEUE},{RELAY_QUEUE_NAME}"]
        workers = [worker_processes.spawn(args, **env) for _ in range(3)]
        for turn in range(3):
            before = Effect.objects.count()
            wait_until(lambda b=before: Effect.objects.count() >= min(total, b + 30), timeout_s=60,
                       message=f"no progress through the pooler; log:\n{workers[turn].output()[-3000:]}")
            workers[turn].kill_group()
            workers[turn] = worker_processes.spawn(args, **env)
        wait_until(lambda: not OutboxMessage.objects.filter(status="pending").exists()
                   and Effect.objects.filter(key__startswith="c").values("key").distinct().count() == total,
                   timeout_s=90, interval_s=0.5,
                   message=f"backlog not finished; log:\n{workers[-1].output()[-3000:]}")
        assert [worker.terminate() for worker in workers] == [0, 0, 0]
        seen = session_seen(bouncer.url(connection.settings_dict["NAME"]))
    counts = Effect.objects.filter(key__startswith="c").values("key").annotate(n=Count("id"))
    assert len(counts) == total
    assert [row for row in counts if row["n"] != 1] == [], "an effect ran twice"
    assert ProcessedMessage.objects.filter(actor="crash_effect").count() == total
    assert not DeadLetter.objects.filter(actor="crash_effect").exists()
    assert seen == defaults
