"""Relay throughput against a bare loop of ``actor.send()`` to the same Redis broker.

Both sides put the same N messages (kwargs ``{"seq": i}``) on the same Dramatiq queue of the
configured Redis broker. The baseline calls ``actor.send()`` N times; the relay drains N pending
outbox rows (claim, one batched Lua enqueue per batch, mark sent) with the default batch size.
Publishing the rows is not timed: it happens in the business transactions. Each round starts
from a vacuumed table. Rounds alternate; the best of each counts.

Goal: ratio >= 1.5x; floor 0.8x. Run: ``python bench/bench_relay_throughput.py``.
"""

from __future__ import annotations

import os
import sys
import time

from _util import fill_outbox, setup_django

setup_django()

import dramatiq  # noqa: E402
from django.db import connection  # noqa: E402

from composition.broker.configured import configured_broker  # noqa: E402
from composition.conf import conf  # noqa: E402
from composition.outbox import OutboxMessage  # noqa: E402
from composition.outbox.relay import Relay  # noqa: E402

MESSAGES = int(os.environ.get("BENCH_MESSAGES", "5000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
QUEUE = "bench_relay_throughput"
GOAL = 1.5


def bench_noop(seq: int) -> None:
    """Never consumed: the benchmark measures getting messages onto the broker."""


def main() -> int:
    broker = configured_broker()
    actor = dramatiq.actor(actor_name="bench_relay_noop", queue_name=QUEUE, broker=broker)(bench_noop)

    def reset() -> None:
        broker.flush(QUEUE)
        OutboxMessage.objects.filter(queue_name=QUEUE).delete()
        # Start each round from a table as autovacuum keeps it, not one carrying the previous
        # round's 5,000 deleted rows in its pending index (production prunes old rows slowly).
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM {connection.ops.quote_name(OutboxMessage._meta.db_table)}")

    def queued() -> int:
        return int(broker.client.llen(f"dramatiq:{QUEUE}"))  # type: ignore[attr-defined]

    def send_loop() -> float:
        reset()
        began = time.perf_counter()
        for seq in range(MESSAGES):
            actor.send(seq=seq)
        took = time.perf_counter() - began
        assert queued() == MESSAGES
        return took

    def relay_drain() -> float:
        reset()
        fill_outbox(actor.actor_name, QUEUE, MESSAGES)
        relay = Relay(broker)
        began = time.perf_counter()
        relayed = relay.run_until_idle()
        took = time.perf_counter() - began
        assert relayed == MESSAGES and queued() == MESSAGES, (relayed, queued())
        return took

    send_loop()  # warm up connections and the script cache
    baseline, relay_times = [], []
    for _ in range(ROUNDS):
        baseline.append(send_loop())
        relay_times.append(relay_drain())
    reset()
    base_rate = MESSAGES / min(baseline)
    relay_rate = MESSAGES / min(relay_times)
    ratio = relay_rate / base_rate
    print(f"messages per round: {MESSAGES}, rounds: {ROUNDS}, relay batch size: {conf.OUTBOX_BATCH_SIZE}")
    print(f"baseline actor.send() loop: {base_rate:,.0f} msg/s (best {min(baseline):.3f} s; "
          f"rounds {', '.join(f'{t:.3f}' for t in baseline)})")
    print(f"outbox relay:               {relay_rate:,.0f} msg/s (best {min(relay_times):.3f} s; "
          f"rounds {', '.join(f'{t:.3f}' for t in relay_times)})")
    print(f"ratio relay/baseline: {ratio:.2f}x (goal >= {GOAL}x): {'goal met' if ratio >= GOAL else 'MISSED'}")
    return 0 if ratio >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
