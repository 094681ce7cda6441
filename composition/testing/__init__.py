"""Test helpers shipped with the package: real throwaway servers and real worker processes.

Nothing here mocks a database, cache or broker; these start real ones (or real processes) and
clean them up.
"""

from composition.testing.relay import left_to_the_relay
from composition.testing.servers import ThrowawayPostgres, ThrowawayRedis, throwaway_postgres, throwaway_redis
from composition.testing.waiting import free_port, http_status, wait_until
from composition.testing.workers import WorkerProcess, current_database_url, subprocess_env, use_broker

__all__ = [
    "ThrowawayPostgres",
    "ThrowawayRedis",
    "WorkerProcess",
    "current_database_url",
    "free_port",
    "http_status",
    "left_to_the_relay",
    "subprocess_env",
    "throwaway_postgres",
    "throwaway_redis",
    "use_broker",
    "wait_until",
]
