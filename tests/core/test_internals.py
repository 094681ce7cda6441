"""The internals of other libraries listed in docs/architecture.md ("Internals of other
libraries we rely on") are still there in the installed releases: a release that removes or
renames one fails here, by name, rather than somewhere deep in a scenario."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db


def test_django_s_connection_internals_are_there() -> None:
    connection.ensure_connection()
    for name in ("run_on_commit", "savepoint_ids", "savepoint_state", "execute_wrappers", "inc_thread_sharing"):
        assert hasattr(connection, name), name
    with connection.cursor() as cursor:
        assert hasattr(cursor.cursor, "nextset"), "CursorWrapper.cursor is psycopg's cursor"


def test_django_s_query_and_logging_internals_are_there() -> None:
    import inspect

    from django.utils import log

    from composition.outbox.models import OutboxMessage

    assert hasattr(OutboxMessage.objects.all().query, "get_compiler")
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    assert isinstance(executor.migration_plan(executor.loader.graph.leaf_nodes()), list)
    assert "_has_been_logged" in inspect.getsource(log.log_response)


def test_the_broker_and_server_internals_are_there() -> None:
    import pika.adapters.blocking_connection as blocking
    from dramatiq.brokers.redis import RedisBroker
    from gunicorn.workers import gthread

    assert callable(RedisBroker._max_unpack_size)
    assert hasattr(blocking.BlockingChannel, "_flush_output")
    assert "_impl" in blocking.BlockingChannel.__init__.__code__.co_names
    assert isinstance(gthread.DEFAULT_WORKER_DATA_TIMEOUT, float)
    assert "initialized" in gthread.TConn.__init__.__code__.co_names


def test_dramatiq_s_enqueue_and_dispatch_script_are_as_the_waking_broker_extends_them() -> None:
    import redis
    from dramatiq.brokers.redis import RedisBroker

    source = RedisBroker(client=redis.Redis()).scripts["dispatch"].script  # connects to nothing
    source = source if isinstance(source, bytes) else source.encode()
    # Eight arguments, then the command's: an enqueue's two, after which the wake tokens go.
    assert b"local command = ARGV[1]" in source
    assert b"for i=9,#ARGV do" in source
    assert b"local message_data = ARGS[2]" in source
    assert "do_enqueue" in RedisBroker.enqueue.__code__.co_names


def test_dramatiq_s_consumers_have_what_the_pausable_ones_use() -> None:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker, _RabbitmqConsumer
    from dramatiq.brokers.redis import _RedisConsumer

    redis_init = _RedisConsumer.__init__.__code__.co_names
    assert {"message_cache", "queued_message_ids"} <= set(redis_init)
    assert isinstance(_RedisConsumer.outstanding_message_count, property)
    rabbit_init = _RabbitmqConsumer.__init__.__code__.co_names
    assert {"connection", "channel", "iterator", "known_tags"} <= set(rabbit_init)
    assert isinstance(RabbitmqBroker.consumer_class, property)


def test_dramatiq_s_consumer_thread_makes_its_consumer_and_moves_delayed_messages_itself() -> None:
    import inspect

    from dramatiq.worker import _ConsumerThread

    # The consumer is made in the thread's run loop (consumer_of_this_thread), and the thread
    # moves due delayed messages with broker.enqueue and drops them on a lost connection.
    run = inspect.getsource(_ConsumerThread.run)
    assert "self.broker.consume(" in run and "except BrokerConnectionError" in run
    assert "self.delay_queue = PriorityQueue()" in run
    assert "self.broker.enqueue(" in inspect.getsource(_ConsumerThread.handle_delayed_messages)


def test_dramatiq_s_rabbitmq_broker_declares_through_the_methods_the_quorum_queues_replace() -> None:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    ensure = RabbitmqBroker._ensure_queue.__code__.co_names
    assert {"_declare_queue", "_declare_dq_queue", "_declare_xq_queue", "queues_pending"} <= set(ensure)
    assert "_declare_queue" in RabbitmqBroker.get_queue_message_counts.__code__.co_names


def test_dramatiq_s_worker_start_adds_one_middleware_of_its_own_to_the_broker() -> None:
    from dramatiq import Worker
    from dramatiq.brokers.stub import StubBroker

    # WorkerComponent takes what start() added off again at its stop (docs/architecture.md).
    broker = StubBroker(middleware=[])
    before = list(broker.middleware)
    worker = Worker(broker, worker_threads=1, worker_timeout=10)
    assert broker.middleware == before, "not at construction"
    worker.start()
    try:
        added = [each for each in broker.middleware if not any(each is old for old in before)]
        assert len(added) == 1 and hasattr(added[0], "after_declare_queue"), added
    finally:
        worker.stop()
