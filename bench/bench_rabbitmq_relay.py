"""Relay throughput over RabbitMQ with publisher confirms, against a bare confirmed ``actor.send()`` loop.

Both sides put the same N messages (kwargs ``{"seq": i}``) on the same queue of one RabbitMQ
broker built by ``composition.broker.configured.build_broker`` (``confirm_delivery=True``: every message is
confirmed by RabbitMQ before it counts). The baseline calls ``actor.send()`` N times, one confirm
round trip per message; the relay drains N pending outbox rows in batches of 500 (claim, publish
the batch on a confirm channel and wait once for all its confirms, mark sent). Publishing the
rows is not timed: it happens in the business transactions. Each round starts from a vacuumed
table and an empty queue. Rounds alternate; the best of each counts.

Then, without the database, the two ways to confirm a batch in one round trip, on the same
messages and batches: publisher confirms on a channel of our own (what the relay uses,
``composition.outbox.rabbitmq``) and one AMQP transaction per batch (``tx_select`` /
``tx_commit``, implemented here only to be measured).

Goal: relay/baseline >= 3x; floor 1x. Run: ``RABBITMQ_URL=amqp://... python bench/bench_rabbitmq_relay.py``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from typing import Any

from _util import fill_outbox, setup_django

setup_django()

import dramatiq  # noqa: E402
import pika  # noqa: E402
from django.db import connection  # noqa: E402
from dramatiq.common import dq_name, xq_name  # noqa: E402
from dramatiq.message import Message  # noqa: E402

from composition.broker.configured import build_broker  # noqa: E402
from composition.outbox import OutboxMessage  # noqa: E402
from composition.outbox.rabbitmq import enqueue_confirmed  # noqa: E402
from composition.outbox.relay import Relay  # noqa: E402

RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
MESSAGES = int(os.environ.get("BENCH_MESSAGES", "5000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
BATCH = 500
CONFIRM_TIMEOUT_S = 30.0
QUEUE = f"bench_rabbitmq_relay_{uuid.uuid4().hex[:8]}"  # unique per run, deleted at the end
GOAL = 3.0


def bench_noop(seq: int) -> None:
    """Never consumed: the benchmark measures getting messages onto the broker."""


def _publish_tx(channel: Any, items: list[tuple[Message[Any], int | None]]) -> None:
    """The losing alternative: the batch as one AMQP transaction on a channel in tx mode."""
    for message, _ in items:
        channel.basic_publish(exchange="", routing_key=message.queue_name, body=message.encode(),
                              properties=pika.BasicProperties(delivery_mode=2,
                                                              priority=message.options.get("broker_priority")),
                              mandatory=True)
    channel.tx_commit()


def main() -> int:
    logging.getLogger("pika").setLevel(logging.WARNING)  # one INFO line per channel otherwise
    broker = build_broker(RABBITMQ_URL, heartbeat_timeout_s=60.0, maintenance_chance=0)
    actor = dramatiq.actor(actor_name="bench_rabbitmq_relay_noop", queue_name=QUEUE, broker=broker)(bench_noop)
    broker.declare_queue(QUEUE, ensure=True)

    def queued() -> int:
        return int(broker.get_queue_message_counts(QUEUE)[0])

    def reset() -> None:
        broker.flush(QUEUE)
        OutboxMessage.objects.filter(queue_name=QUEUE).delete()
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM {connection.ops.quote_name(OutboxMessage._meta.db_table)}")

    def send_loop() -> float:
        reset()
        began = time.perf_counter()
        for seq in range(MESSAGES):
            actor.send(seq=seq)
        took = time.perf_counter() - began
        assert queued() == MESSAGES, queued()
        return took

    def relay_drain() -> float:
        reset()
        fill_outbox(actor.actor_name, QUEUE, MESSAGES)
        relay = Relay(broker, batch_size=BATCH)
        began = time.perf_counter()
        relayed = relay.run_until_idle()
        took = time.perf_counter() - began
        assert relayed == MESSAGES and queued() == MESSAGES, (relayed, queued())
        return took

    messages = [(actor.message_with_options(kwargs={"seq": seq}), None) for seq in range(MESSAGES)]
    batches = [messages[start:start + BATCH] for start in range(0, MESSAGES, BATCH)]
    tx_connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    tx_channel = tx_connection.channel()
    tx_channel.tx_select()

    def confirm_channel() -> float:
        broker.flush(QUEUE)
        began = time.perf_counter()
        for batch in batches:
            enqueue_confirmed(broker, batch, confirm_timeout_s=CONFIRM_TIMEOUT_S)
        took = time.perf_counter() - began
        assert queued() == MESSAGES, queued()
        return took

    def transactions() -> float:
        broker.flush(QUEUE)
        began = time.perf_counter()
        for batch in batches:
            _publish_tx(tx_channel, batch)
        took = time.perf_counter() - began
        assert queued() == MESSAGES, queued()
        return took

    try:
        send_loop()  # warm up connections and channels
        baseline, relay_times, confirm_times, tx_times = [], [], [], []
        for _ in range(ROUNDS):
            baseline.append(send_loop())
            relay_times.append(relay_drain())
            confirm_times.append(confirm_channel())
            tx_times.append(transactions())
        reset()
    finally:
        tx_connection.close()
        for name in (QUEUE, dq_name(QUEUE), xq_name(QUEUE)):
            broker.channel.queue_delete(name)
        broker.close()

    def rounds(times: list[float]) -> str:
        return f"best {min(times):.3f} s; rounds {', '.join(f'{t:.3f}' for t in times)}"

    base_rate = MESSAGES / min(baseline)
    relay_rate = MESSAGES / min(relay_times)
    ratio = relay_rate / base_rate
    print(f"messages per round: {MESSAGES}, rounds: {ROUNDS}, relay batch size: {BATCH}, broker: RabbitMQ "
          "with publisher confirms")
    print(f"baseline confirmed actor.send() loop: {base_rate:,.0f} msg/s ({rounds(baseline)})")
    print(f"outbox relay, confirmed batches:      {relay_rate:,.0f} msg/s ({rounds(relay_times)})")
    print(f"ratio relay/baseline: {ratio:.2f}x (goal >= {GOAL}x): {'goal met' if ratio >= GOAL else 'MISSED'}")
    confirm_rate = MESSAGES / min(confirm_times)
    tx_rate = MESSAGES / min(tx_times)
    print(f"one round trip per batch of {BATCH}, no database:")
    print(f"  publisher confirms, own channel (used): {confirm_rate:,.0f} msg/s ({rounds(confirm_times)})")
    print(f"  AMQP transaction per batch:             {tx_rate:,.0f} msg/s ({rounds(tx_times)})")
    print(f"  confirms/transactions: {confirm_rate / tx_rate:.2f}x")
    return 0 if ratio >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
