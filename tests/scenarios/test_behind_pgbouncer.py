"""Workers behind PgBouncer in transaction mode, with fewer server connections than threads: a
SIGKILL storm leaves every idempotent effect exactly once, and the pooler's next client then sees
the server's defaults and no lock (issue #38; each test starts its own PgBouncer)."""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg.rows
import pytest
from django.db import connection, transaction
from django.db.models import Count

from composition.jobs.models import DeadLetter, ProcessedMessage
from composition.outbox import OutboxMessage, publish
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.testing import current_database_url, wait_until
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
