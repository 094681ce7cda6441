"""Messages that share a key start in publish order through the fast path (the publishing process
sends its rows right after COMMIT), into a real ``runworkers`` with one thread: when each row is
sent at its own COMMIT, and when a later row of the key commits while an earlier one's send is
still to come."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
from django.db import connection, transaction

from composition.broker.configured import configured_broker
from composition.outbox import OutboxMessage, publish
from composition.outbox.relay import RELAY_QUEUE_NAME, Relay, relay_for
from composition.testing import wait_until
from tests.jobsapp import jobs
from tests.jobsapp.models import Effect
from tests.outboxapp.helpers import enqueued

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.empty_queues(jobs.ORDER_QUEUE, RELAY_QUEUE_NAME),
]

KEY = "fast-path-order"
# One worker thread: a key's jobs then start one after the other, in the order it takes them.
WORKER_ARGS = ["--threads", "1", "--queues", jobs.ORDER_QUEUE]


def _start_order(key: str) -> list[int]:
    """The seqs of ``key``'s jobs in the order their bodies started."""
    keys = Effect.objects.filter(key__startswith=f"{key}:").order_by("id").values_list("key", flat=True)
    return [int(name.rsplit(":", 1)[1]) for name in keys]


def _ready_worker(worker_processes: Any) -> Any:
    """A ``runworkers`` (1 process, 1 thread) that has run a first job, so it is consuming."""
    worker = worker_processes.spawn(WORKER_ARGS)
    publish(jobs.record_start, {"key": "warm-up", "seq": 0})
    wait_until(lambda: Effect.objects.filter(key="warm-up:0").exists(), 60, 0.05,
               message=f"the worker never ran its first job; its log:\n{worker.output()[-3000:]}")
    return worker


def _wait_for_starts(worker: Any, count: int) -> None:
    wait_until(lambda: Effect.objects.filter(key__startswith=f"{KEY}:").count() >= count, 60, 0.05,
               message=f"not every job ran; worker log:\n{worker.output()[-3000:]}")


def _publish_one_per_transaction_and_run(worker_processes: Any, count: int) -> tuple[Any, list[OutboxMessage]]:
    """Publish ``count`` rows of one key, one transaction each, back to back: the worker (20 ms a
    job) falls behind, so the messages queue up and its prefetch takes them in batches. Checks
    they started in publish order; returns the worker and the rows."""
    worker = _ready_worker(worker_processes)
    ids = []
    for seq in range(count):
        with transaction.atomic():
            ids.append(publish(jobs.record_start, {"key": KEY, "seq": seq}, key=KEY).pk)
    _wait_for_starts(worker, count)
    assert _start_order(KEY) == list(range(count))
    return worker, list(OutboxMessage.objects.filter(pk__in=ids).order_by("id"))


def test_messages_that_share_a_key_start_in_publish_order_through_the_fast_path(worker_processes: Any) -> None:
    worker, rows = _publish_one_per_transaction_and_run(worker_processes, 40)
    # Every row went the one hop from its COMMIT: sent by this (the publishing) process, not
    # the worker's relay, and claimed once.
    publisher = relay_for(configured_broker()).relay_id
    assert {(row.status, row.claimed_by, row.attempts) for row in rows} == {("sent", publisher, 1)}
    assert worker.terminate() == 0


def test_sent_on_the_committing_thread_each_row_is_on_the_broker_before_the_next_is_published(
        worker_processes: Any) -> None:
    worker, rows = _publish_one_per_transaction_and_run(worker_processes, 10)
    for row, following in itertools.pairwise(rows):
        assert row.sent_at is not None and row.sent_at <= following.created_at, (row.pk, row.sent_at,
                                                                                following.created_at)
    assert worker.terminate() == 0


def _publish_before_the_send(seqs: list[int], ids: list[int], errors: list[BaseException]) -> None:
    """Publish ``seqs[0]`` in a transaction whose after-commit send runs only once the rest of
    ``seqs`` were published, each in a transaction of its own on another connection (a thread),
    and their own sends ran: as if other processes committed the key's later rows while this one
    was still between its COMMIT and its send. The sends run in reverse publish order."""
    def publish_the_rest() -> None:
        if seqs[1:]:
            thread = threading.Thread(target=_in_thread, args=(seqs[1:], ids, errors))
            thread.start()
            thread.join()

    with transaction.atomic():
        # Registered before publish() registers its send: Django runs the hooks in that order.
        transaction.on_commit(publish_the_rest)
        ids.append(publish(jobs.record_start, {"key": KEY, "seq": seqs[0]}, key=KEY).pk)


def _in_thread(seqs: list[int], ids: list[int], errors: list[BaseException]) -> None:
    try:
        _publish_before_the_send(seqs, ids, errors)
    except BaseException as exc:
        errors.append(exc)
    finally:
        connection.close()


def test_a_later_row_of_a_key_sent_before_the_earlier_one_still_starts_after_it(worker_processes: Any) -> None:
    worker = _ready_worker(worker_processes)
    count = 6
    ids: list[int] = []
    errors: list[BaseException] = []
    _publish_before_the_send(list(range(count)), ids, errors)
    assert errors == []
    assert ids == sorted(ids)  # publish order is id order
    _wait_for_starts(worker, count)
    # Without the key-head rule the last row, sent first, would start first.
    assert _start_order(KEY) == list(range(count))

    # The head went the one hop; the rows behind it waited for it and were relayed after.
    rows = list(OutboxMessage.objects.filter(pk__in=ids).order_by("id"))
    assert rows[0].claimed_by == relay_for(configured_broker()).relay_id
    assert {row.status for row in rows} == {"sent"}
    head_sent_at = rows[0].sent_at
    assert head_sent_at is not None and all(row.sent_at and row.sent_at >= head_sent_at for row in rows[1:])
    assert worker.terminate() == 0


def test_a_row_that_waited_behind_another_transaction_s_head_is_nudged_for_once_the_head_is_sent() -> None:
    # No worker: what each after-commit send put on the broker stays there to be read.
    ids: list[int] = []
    errors: list[BaseException] = []
    _publish_before_the_send([0, 1], ids, errors)
    assert errors == []
    head, follower = OutboxMessage.objects.filter(pk__in=ids).order_by("id")
    assert (head.status, follower.status) == ("sent", "pending")
    [job] = enqueued(jobs.ORDER_QUEUE)
    assert job.kwargs["seq"] == 0
    # Two nudges: the follower's own (its head was still in flight: a relay woken by it finds
    # nothing to take), and one from the head's send once the head is sent, which the follower
    # needs; without it the follower waits for the next sweep.
    nudges = enqueued(RELAY_QUEUE_NAME)
    assert len(nudges) == 2, [n.message_timestamp for n in nudges]
    assert nudges[-1].message_timestamp >= job.message_timestamp
    assert Relay(configured_broker()).run_until_idle() == 1
    assert [message.kwargs["seq"] for message in enqueued(jobs.ORDER_QUEUE)] == [0, 1]
