"""The baseline of bench_workers.py: the same no-op actor under the plain ``dramatiq`` command,
with Dramatiq's default middleware and no Django."""

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

broker = RedisBroker(url=os.environ["BENCH_BROKER_URL"])
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=os.environ.get("BENCH_QUEUE", "jobs_noop"), actor_name="noop", max_retries=0)
def noop() -> None:
    """Nothing: the benchmark measures the machinery around a job."""
