"""Test helpers shipped with the package: real throwaway servers (Valkey, PostgreSQL, a PgBouncer
in front of one, a RabbitMQ cluster), a fault proxy in front of a real service, real worker
processes, the queued jobs run in the test's own process, queues emptied between tests and
metrics read as one number.

Nothing here mocks a database, cache or broker; these start real ones (or real processes) and
clean them up.
"""

from composition.testing.metrics import metric_value
from composition.testing.pgbouncer import ThrowawayPgBouncer, throwaway_pgbouncer
from composition.testing.proxy import FaultProxy, fault_proxy
from composition.testing.queued_jobs import JobRun, JobsFailed, QueuedJobsRun, run_queued_jobs
from composition.testing.queues import empty_queues
from composition.testing.rabbitmq_cluster import ThrowawayRabbitCluster, throwaway_rabbit_cluster
from composition.testing.relay import left_to_the_relay
from composition.testing.servers import ThrowawayPostgres, ThrowawayRedis, throwaway_postgres, throwaway_redis
from composition.testing.waiting import free_port, http_status, wait_until
from composition.testing.workers import WorkerProcess, current_database_url, subprocess_env, use_broker

__all__ = [
    "FaultProxy",
    "JobRun",
    "JobsFailed",
    "QueuedJobsRun",
    "ThrowawayPgBouncer",
    "ThrowawayPostgres",
    "ThrowawayRabbitCluster",
    "ThrowawayRedis",
    "WorkerProcess",
    "current_database_url",
    "empty_queues",
    "fault_proxy",
    "free_port",
    "http_status",
    "left_to_the_relay",
    "metric_value",
    "run_queued_jobs",
    "subprocess_env",
    "throwaway_pgbouncer",
    "throwaway_postgres",
    "throwaway_rabbit_cluster",
    "throwaway_redis",
    "use_broker",
    "wait_until",
]
