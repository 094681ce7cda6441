"""``actor.send()`` on the waking Redis broker against Dramatiq's plain ``RedisBroker``.

Three brokers on the configured Redis, no middleware (so the broker's own cost is all that
differs), each sending to its own queue:

- ``RedisBroker``: Dramatiq's enqueue, one script call (the baseline);
- ``WakingRedisBroker``: the same call also pushes the wake token (one round trip);
- two calls: the waking broker as it was, the enqueue and then a second script for the token.

In each round the sides take turns by chunks of sends; each side's median round counts.
Goal: the waking broker's send within 1.15x ``RedisBroker``'s.
Run: ``python bench/bench_broker_send.py`` (BENCH_SENDS, BENCH_ROUNDS to tune).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

from _util import setup_django

setup_django()

import dramatiq  # noqa: E402
import redis  # noqa: E402
from dramatiq.brokers.redis import RedisBroker  # noqa: E402

from composition.broker.redis import WakingRedisBroker, wake_args  # noqa: E402
from composition.conf import conf  # noqa: E402

SENDS = int(os.environ.get("BENCH_SENDS", "5000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
CHUNK = 20  # sends in a row on one side
QUEUE = "bench_broker_send"
GOAL = 1.15


class TwoCallBroker(WakingRedisBroker):
    """The waking broker before its enqueue and wake token shared one script call."""

    def do_enqueue(self, queue_name: str, message_id: str, data: bytes) -> None:
        # dispatch.lua's enqueue with no token (wake_args for no queue), then the token.
        RedisBroker.__getattr__(self, "do_enqueue")(queue_name, message_id, data, *wake_args(self, []))
        self.wake([queue_name])


def noop() -> None:
    """Never consumed: the benchmark measures getting messages onto the broker."""


def main() -> int:
    brokers: dict[str, RedisBroker] = {
        name: cls(client=redis.Redis.from_url(conf.BROKER_URL), middleware=[])
        for name, cls in (("RedisBroker", RedisBroker), ("WakingRedisBroker", WakingRedisBroker),
                          ("two calls", TwoCallBroker))}
    actors: dict[str, Any] = {
        name: dramatiq.actor(actor_name=f"{QUEUE}_{i}", queue_name=f"{QUEUE}_{i}", broker=broker)(noop)
        for i, (name, broker) in enumerate(brokers.items())}

    def flush() -> None:
        for name, broker in brokers.items():
            broker.flush(actors[name].queue_name)

    per_send_s: dict[str, list[float]] = {name: [] for name in brokers}
    try:
        for actor in actors.values():  # warm up connections and scripts
            for _ in range(max(10, SENDS // 10)):
                actor.send()
        names = list(brokers)
        for _ in range(ROUNDS):
            flush()
            took_s = dict.fromkeys(names, 0.0)
            # The sides take turns by chunks, in rotating order: a burst of load from a
            # neighbour falls on all of them alike, not on one side's whole round.
            for chunk in range(SENDS // CHUNK):
                for name in names[chunk % len(names):] + names[:chunk % len(names)]:
                    send = actors[name].send
                    began = time.perf_counter()
                    for _ in range(CHUNK):
                        send()
                    took_s[name] += time.perf_counter() - began
            for name in names:
                per_send_s[name].append(took_s[name] / (SENDS // CHUNK * CHUNK))
    finally:
        flush()
        for broker in brokers.values():
            broker.client.close()

    median_s = {name: statistics.median(rounds) for name, rounds in per_send_s.items()}
    baseline_s = median_s["RedisBroker"]
    for name, seconds in median_s.items():
        print(f"{name:>17}: {seconds * 1e6:7.1f} us/send  ({seconds / baseline_s:.2f}x RedisBroker)")
    ratio = median_s["WakingRedisBroker"] / baseline_s
    print(f"WakingRedisBroker send vs RedisBroker: {ratio:.2f}x (goal <= {GOAL}x) "
          f"{'ok' if ratio <= GOAL else 'OVER GOAL'}")
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
