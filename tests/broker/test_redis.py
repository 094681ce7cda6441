"""Redis-broker consumers wake when a message arrives (``composition.broker.redis``): a message
sent to an idle queue or its delay queue, directly or through the outbox, starts long before the
idle wait ends; an idle consumer returns after one idle wait, and at once when its worker stops
(``end_waits``), even with Redis frozen; messages put back with no token of their own (a dead
worker's, a burst larger than its tokens) still reach every idle consumer at once; the wake lists
stay bounded when nobody listens. A send stores its message and
pushes its token in one round trip, between Dramatiq's enqueue hooks."""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit
from uuid import uuid4

import dramatiq
import pytest
import redis
from django.conf import settings
from django.db import transaction
from dramatiq.common import dq_name
from dramatiq.message import Message
from structlog.testing import capture_logs

from composition.broker.configured import build_broker, configured_broker
from composition.broker.redis import WAKE_TOKENS_MAX, WAKE_TTL_MS, WakingRedisBroker
from composition.broker.redis_consumer import end_waits, wake_key
from composition.conf import conf
from composition.jobs.recovery import return_dead_workers_messages
from composition.jobs.runtime import drain_worker, stop_intake
from composition.outbox import OutboxMessage, publish
from composition.outbox.enqueue import enqueue_many
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.testing import fault_proxy, wait_until
from tests.jobsapp import jobs

# The consumers' poll (Dramatiq's timeout): what a paused queue or a full prefetch waits. Long,
# so that a consumer that sleeps between polls (Dramatiq's backs off towards it) visibly misses
# the bound below; a waking consumer is at a few milliseconds.
IDLE_POLL_MS = 1000
START_BOUND_S = 0.1
SENDS = 6  # a polling consumer misses the bound on nearly every send: its median could not pass
# Gaps longer than the idle poll: a polling consumer is then deep in its back-off.
GAP_S = (1.0, 1.5)
UNIT_QUEUE = "wake_unit"


@pytest.fixture
def broker() -> WakingRedisBroker:
    broker = configured_broker()
    assert isinstance(broker, WakingRedisBroker)
    return broker


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    yield client
    client.close()


pytestmark = pytest.mark.empty_queues(UNIT_QUEUE, jobs.WAKE_QUEUE, RELAY_QUEUE_NAME)


@pytest.fixture(autouse=True)
def _no_wake_stamps(client: redis.Redis) -> Iterator[None]:
    client.delete(jobs.WAKE_STAMPS_KEY)
    yield
    client.delete(jobs.WAKE_STAMPS_KEY)


def _message(queue_name: str = UNIT_QUEUE) -> Message[Any]:
    return Message(queue_name=queue_name, actor_name="wake_unit_probe", args=(), kwargs={}, options={})


# -- the consumer, in this process ---------------------------------------------------------------

def test_an_idle_consumer_returns_when_a_message_arrives_and_otherwise_after_one_idle_wait(
        broker: WakingRedisBroker) -> None:
    consumer = broker.consume(UNIT_QUEUE, prefetch=1, timeout=10)
    try:
        # Nothing arrives: it waits out one idle wait, not the 10 ms poll (no busy loop, and a
        # missing token costs no more than that).
        began = time.monotonic()
        assert next(consumer) is None
        waited_s = time.monotonic() - began
        assert 0.8 * broker.idle_wait_s <= waited_s < broker.idle_wait_s + 0.5, waited_s

        # A message enqueued mid-wait ends the wait at once, and is the next thing fetched.
        sent_at: list[float] = []
        sender = threading.Timer(0.3, lambda: (sent_at.append(time.monotonic()), broker.enqueue(_message())))
        began = time.monotonic()
        sender.start()
        assert next(consumer) is None
        returned_at = time.monotonic()
        sender.join()
        assert returned_at - began >= 0.25, "returned before the message was sent: it polled"
        assert returned_at - sent_at[0] < START_BOUND_S, returned_at - sent_at[0]
        proxy = next(consumer)
        assert proxy is not None and proxy.actor_name == "wake_unit_probe"
        consumer.ack(proxy)
    finally:
        consumer.close()


def test_a_wait_stays_within_the_socket_timeout() -> None:
    # A 5 s idle wait on a client whose socket times out after 0.4 s: the wait is cut to half of
    # that, instead of ending in a socket timeout (a consumer restart).
    broker = build_broker(conf.BROKER_URL, heartbeat_timeout_s=5.0, maintenance_chance=0,
                          socket_timeout_s=0.4, middleware=[])
    assert isinstance(broker, WakingRedisBroker)
    broker.idle_wait_s = 5.0
    consumer = broker.consume(UNIT_QUEUE, prefetch=1, timeout=5000)
    try:
        began = time.monotonic()
        assert next(consumer) is None
        assert 0.15 <= time.monotonic() - began < 0.39
    finally:
        consumer.close()
        broker.client.close()


def test_a_delayed_message_wakes_its_delay_queue_s_consumer(broker: WakingRedisBroker, client: redis.Redis) -> None:
    # A delayed message goes to the delay queue and wakes its consumer, not the queue's: the
    # delay queue's consumer, idle in its wait, fetches it at once and holds it until it is due.
    consumer = broker.consume(dq_name(UNIT_QUEUE), prefetch=1, timeout=IDLE_POLL_MS)
    try:
        enqueued: list[Message[Any]] = []
        sender = threading.Timer(0.3, lambda: enqueued.append(broker.enqueue(_message(), delay=10_000)))
        began = time.monotonic()
        sender.start()
        assert next(consumer) is None
        sender.join()
        assert time.monotonic() - began < 0.3 + START_BOUND_S, "it polled: the delayed message woke nobody"
        assert enqueued[0].queue_name == dq_name(UNIT_QUEUE)
        assert not client.exists(wake_key(broker, UNIT_QUEUE))
        proxy = next(consumer)
        assert proxy is not None and proxy.options["eta"] == enqueued[0].options["eta"]
        consumer.ack(proxy)
    finally:
        consumer.close()


def test_end_waits_ends_an_idle_wait_at_once(broker: WakingRedisBroker) -> None:
    # A stopping worker ends its consumers' waits (runtime.stop_intake), rather than waiting for
    # an idle wait to run out; a consumer of the same queue elsewhere keeps waiting.
    here = broker.consume(UNIT_QUEUE, prefetch=1, timeout=IDLE_POLL_MS)
    elsewhere = broker.consume(UNIT_QUEUE, prefetch=1, timeout=IDLE_POLL_MS)
    waited: dict[str, float] = {}

    def wait(name: str, consumer: Any) -> None:
        began = time.monotonic()
        assert next(consumer) is None
        waited[name] = time.monotonic() - began

    threads = [threading.Thread(target=wait, args=(name, consumer)) for name, consumer in
               (("here", here), ("elsewhere", elsewhere))]
    try:
        for thread in threads:
            thread.start()
        time.sleep(0.2)
        pushing = end_waits([here])
        assert pushing is not None
        for thread in [*threads, pushing]:
            thread.join(5)
        assert waited["here"] < 0.2 + START_BOUND_S, waited
        assert waited["elsewhere"] >= 0.8 * broker.idle_wait_s, waited
    finally:
        here.close()
        elsewhere.close()


def test_messages_handed_back_wake_consumers(broker: WakingRedisBroker, client: redis.Redis) -> None:
    # What a stopping worker hands back (requeue_unacked, Dramatiq's own unrun prefetch) goes
    # through do_requeue, and wakes another worker's consumer for each message.
    consumer = broker.consume(UNIT_QUEUE, prefetch=2, timeout=IDLE_POLL_MS)
    try:
        broker.enqueue(_message())
        broker.enqueue(_message())
        client.delete(wake_key(broker, UNIT_QUEUE))
        first, second = next(consumer), next(consumer)
        assert first is not None and second is not None
        consumer.requeue([first, second])
        assert client.llen(wake_key(broker, UNIT_QUEUE)) == 2
        assert client.llen(f"{broker.namespace}:{UNIT_QUEUE}") == 2
    finally:
        consumer.close()


def test_wake_lists_stay_bounded_without_consumers(broker: WakingRedisBroker, client: redis.Redis) -> None:
    key = wake_key(broker, UNIT_QUEUE)
    for _ in range(3 * WAKE_TOKENS_MAX):
        broker.enqueue(_message())
    assert client.llen(key) == WAKE_TOKENS_MAX
    assert 0 < client.pttl(key) <= WAKE_TTL_MS

    client.delete(key)
    enqueue_many(broker, [(_message(), None) for _ in range(3)])
    assert client.llen(key) == 3  # a token per message
    enqueue_many(broker, [(_message(), None) for _ in range(5 * WAKE_TOKENS_MAX)]
                 + [(_message(), 1000)])  # the delayed one wakes its delay queue's consumer
    assert client.llen(key) == WAKE_TOKENS_MAX
    assert 0 < client.pttl(key) <= WAKE_TTL_MS
    assert client.llen(wake_key(broker, dq_name(UNIT_QUEUE))) == 1


# -- a send: one round trip, between Dramatiq's enqueue hooks ------------------------------------

class _EnqueueHooks(dramatiq.Middleware):
    """Dramatiq's enqueue hooks as they fire: (hook, queue, delay, whether the message is in Redis
    yet, read through ``client``, not the broker's)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.calls: list[tuple[str, str, int | None, bool]] = []

    def _record(self, hook: str, broker: Any, message: Message[Any], delay: int | None) -> None:
        stored = self.client.hexists(f"{broker.namespace}:{message.queue_name}.msgs",
                                     message.options["redis_message_id"])
        self.calls.append((hook, message.queue_name, delay, bool(stored)))

    def before_enqueue(self, broker: Any, message: Message[Any], delay: int | None) -> None:
        self._record("before", broker, message, delay)

    def after_enqueue(self, broker: Any, message: Message[Any], delay: int | None) -> None:
        self._record("after", broker, message, delay)


@pytest.fixture
def hooks(client: redis.Redis) -> _EnqueueHooks:
    return _EnqueueHooks(client)


@pytest.fixture
def sending_broker(hooks: _EnqueueHooks) -> Iterator[WakingRedisBroker]:
    """A broker of its own (the configured one's Redis and queues), so its actor and hooks go
    with the test."""
    broker = build_broker(conf.BROKER_URL, heartbeat_timeout_s=5.0, maintenance_chance=0, middleware=[hooks])
    assert isinstance(broker, WakingRedisBroker)
    yield broker
    broker.client.close()


def _probe_actor(broker: WakingRedisBroker, runs: list[tuple[float, Any]] | None = None) -> Any:
    def probe(value: Any = None) -> None:
        if runs is not None:
            runs.append((time.monotonic(), value))

    return dramatiq.actor(actor_name="wake_unit_probe", queue_name=UNIT_QUEUE, broker=broker)(probe)


def _commands_sent(broker: WakingRedisBroker, client: redis.Redis, action: Callable[[], object]) -> list[str]:
    """The commands ``broker`` sent to Redis during ``action()``, seen by MONITOR (call it from
    one thread, the broker used by nothing else: its pool then hands the same connection out
    again)."""
    address = broker.client.client_info()["addr"]
    marker = f"end-of-action-{uuid4()}"
    sent: list[str] = []
    with client.monitor() as monitor:
        action()
        client.echo(marker)
        while (command := monitor.next_command())["command"] != f"ECHO {marker}":
            if f"{command['client_address']}:{command['client_port']}" == address:
                sent.append(command["command"].split(" ", 1)[0].upper())
    return sent


@pytest.mark.parametrize("delay_ms", [None, 60_000], ids=["now", "delayed"])
def test_a_send_is_one_round_trip_between_dramatiqs_enqueue_hooks(
        sending_broker: WakingRedisBroker, hooks: _EnqueueHooks, client: redis.Redis, delay_ms: int | None) -> None:
    probe = _probe_actor(sending_broker)
    probe.send()  # the first send loads the script (and Dramatiq's stack size): not counted
    sending_broker.flush(UNIT_QUEUE)
    hooks.calls.clear()

    sent: list[Message[Any]] = []
    commands = _commands_sent(sending_broker, client,
                              lambda: sent.append(probe.send_with_options(delay=delay_ms)))

    assert commands == ["EVALSHA"]
    message = sent[0]
    queue = UNIT_QUEUE if delay_ms is None else dq_name(UNIT_QUEUE)
    assert message.queue_name == queue
    # Dramatiq's layout: the message in <ns>:<queue>.msgs under its Redis id, the id on the queue.
    redis_id = message.options["redis_message_id"]
    assert client.hget(f"{sending_broker.namespace}:{queue}.msgs", redis_id) == message.encode()
    assert client.lrange(f"{sending_broker.namespace}:{queue}", 0, -1) == [redis_id.encode()]
    # The hooks fire as Dramatiq fires them: before the message is stored, and after.
    assert hooks.calls == [("before", queue, delay_ms, False), ("after", queue, delay_ms, True)]
    assert client.llen(wake_key(sending_broker, queue)) == 1
    if delay_ms is not None:  # to the delay queue, due at its eta, waking its consumer only
        assert message.options["eta"] > time.time() * 1000
        assert not client.exists(wake_key(sending_broker, UNIT_QUEUE))


def test_a_send_wakes_a_waiting_worker_which_runs_it(sending_broker: WakingRedisBroker) -> None:
    runs: list[tuple[float, Any]] = []
    probe = _probe_actor(sending_broker, runs)
    worker = dramatiq.Worker(sending_broker, worker_timeout=IDLE_POLL_MS, worker_threads=1)
    worker.start()
    try:
        time.sleep(0.5)  # its consumer finds the queue empty and waits
        sent_at = time.monotonic()
        probe.send("woken")
        wait_until(lambda: runs, timeout_s=5, message="the message never ran")
        ran_at, value = runs[0]
        assert value == "woken"
        # Well within the idle poll, which a polling consumer would be sleeping through.
        assert ran_at - sent_at < 2.5 * START_BOUND_S, ran_at - sent_at
    finally:
        worker.stop(timeout=5000)


def test_a_stopping_worker_s_consumers_leave_their_idle_wait_at_once(sending_broker: WakingRedisBroker) -> None:
    # stop_intake (the drain's first step) ends each consumer's wait: an idle worker stops in
    # a few milliseconds, not after its consumers' idle waits (a second each) run out.
    _probe_actor(sending_broker)
    worker = dramatiq.Worker(sending_broker, worker_timeout=100, worker_threads=1)
    worker.start()
    try:
        time.sleep(0.3)  # both consumers (the queue's and its delay queue's) fetched nothing: waiting
        stop_intake(worker)
        deadline = time.monotonic() + 0.4  # the waits began about 0.3 s ago and last 1 s
        for thread in worker.consumers.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        assert [queue for queue, thread in worker.consumers.items() if thread.is_alive()] == []
    finally:
        drain_worker(worker, time.monotonic() + 5)


def test_a_frozen_redis_does_not_hold_a_stopping_worker(hooks: _EnqueueHooks) -> None:
    # Ending the consumers' waits needs Redis; with Redis frozen, stop_intake (called at the
    # start of the drain, which must go on to the other components at once) still returns at once.
    host, port = urlsplit(conf.BROKER_URL).hostname, urlsplit(conf.BROKER_URL).port
    with fault_proxy(host or "127.0.0.1", port or 6379) as proxy:
        broker = build_broker(proxy.proxied_url(conf.BROKER_URL), heartbeat_timeout_s=5.0, maintenance_chance=0,
                              socket_timeout_s=1.0, middleware=[hooks])
        for queue in ("wake_unit", "wake_unit_2", "wake_unit_3"):
            dramatiq.actor(actor_name=f"{queue}_probe", queue_name=queue, broker=broker)(lambda: None)
        worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=1)
        worker.start()
        try:
            time.sleep(0.3)
            proxy.blackhole()
            began = time.monotonic()
            stop_intake(worker)
            assert time.monotonic() - began < 0.2
        finally:
            proxy.pass_through()
            drain_worker(worker, time.monotonic() + 5)
            broker.client.close()  # type: ignore[attr-defined]


def test_a_dead_worker_s_messages_put_back_wake_an_idle_consumer(broker: WakingRedisBroker) -> None:
    # Dramatiq's maintenance step (run by return_dead_workers_messages) puts a dead worker's
    # messages back with no token: the dispatch script wakes the queue's consumers for them.
    dead = build_broker(conf.BROKER_URL, heartbeat_timeout_s=5.0, maintenance_chance=0, middleware=[])
    taken = dead.consume(UNIT_QUEUE, prefetch=1, timeout=IDLE_POLL_MS)
    broker.enqueue(_message())
    assert next(taken) is not None  # held by the dead worker from now on
    live = build_broker(conf.BROKER_URL, heartbeat_timeout_s=5.0, maintenance_chance=0, middleware=[])
    live.declare_queue(UNIT_QUEUE)
    broker.enqueue(_message())
    # Earlier tests' brokers (this one's own last run among them) left heartbeats that are dead by
    # now: put back first, or their recovery was the wake this asserts is not there (1 run in 5).
    return_dead_workers_messages(live)
    broker.client.delete(wake_key(broker, UNIT_QUEUE))
    return_dead_workers_messages(live)  # every keepalive beat: with no dead worker, it wakes nobody
    assert not broker.client.exists(wake_key(broker, UNIT_QUEUE))
    waiting = live.consume(UNIT_QUEUE, prefetch=1, timeout=IDLE_POLL_MS)
    returned: list[float] = []
    waiter = threading.Thread(target=lambda: (next(waiting), returned.append(time.monotonic())))
    try:
        other = next(waiting)
        assert other is not None  # the queue is empty now
        waiting.ack(other)
        dead.client.zadd(f"{dead.namespace}:__heartbeats__", {dead.broker_id: 0})
        waiter.start()
        time.sleep(0.3)  # waiting
        recovered_at = time.monotonic()
        return_dead_workers_messages(live)
        waiter.join(5)
        assert returned and returned[0] - recovered_at < START_BOUND_S, returned[0] - recovered_at
        proxy = next(waiting)
        assert proxy is not None
        waiting.ack(proxy)
    finally:
        waiter.join(5)
        waiting.close()
        taken.close()
        for each in (dead, live):
            each.client.close()  # type: ignore[attr-defined]


def test_a_keepalive_beat_with_no_dead_worker_is_two_round_trips(
        sending_broker: WakingRedisBroker, client: redis.Redis) -> None:
    # Every worker beats every quarter of the heartbeat timeout: the heartbeat and a look for a
    # dead worker, not Dramatiq's maintenance step on every declared queue (and delay queue).
    for queue in ("wake_unit", "wake_unit_2", "wake_unit_3"):
        sending_broker.declare_queue(queue)
    return_dead_workers_messages(sending_broker)  # loads the script: not counted
    commands = _commands_sent(sending_broker, client, lambda: return_dead_workers_messages(sending_broker))
    assert commands == ["EVALSHA", "ZCOUNT"]


def test_a_burst_larger_than_its_tokens_reaches_every_idle_consumer_at_once(broker: WakingRedisBroker) -> None:
    # One batch pushes at most WAKE_TOKENS_MAX tokens; each consumer whose fetch leaves messages
    # behind wakes one more, so all of 24 idle consumers start within the bound, not after a wait.
    consumers = [broker.consume(UNIT_QUEUE, prefetch=1, timeout=IDLE_POLL_MS) for _ in range(WAKE_TOKENS_MAX + 8)]
    got_at: dict[int, float] = {}

    def take(index: int, consumer: Any) -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            proxy = next(consumer)
            if proxy is not None:
                got_at[index] = time.monotonic()
                consumer.ack(proxy)
                return

    threads = [threading.Thread(target=take, args=(index, consumer)) for index, consumer in enumerate(consumers)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(0.3)  # all waiting
        sent_at = time.monotonic()
        enqueue_many(broker, [(_message(), None) for _ in range(2 * len(consumers))])
        for thread in threads:
            thread.join(10)
        late = sorted(round(at - sent_at, 3) for at in got_at.values() if at - sent_at >= 2 * START_BOUND_S)
        assert len(got_at) == len(consumers) and late == [], (len(got_at), late)
    finally:
        for consumer in consumers:
            consumer.close()


def test_only_a_woken_consumer_s_fetch_wakes_another(broker: WakingRedisBroker, client: redis.Redis) -> None:
    # The chain wake costs a busy consumer's refill nothing: only a fetch after a wake, that
    # leaves messages behind, pushes a token.
    for _ in range(3):
        broker.enqueue(_message())
    client.delete(wake_key(broker, UNIT_QUEUE))
    assert len(broker.do_fetch(UNIT_QUEUE, 1)) == 1
    assert not client.exists(wake_key(broker, UNIT_QUEUE))
    assert len(broker.do_fetch(UNIT_QUEUE, 1, woken=True)) == 1
    assert client.llen(wake_key(broker, UNIT_QUEUE)) == 1
    client.delete(wake_key(broker, UNIT_QUEUE))
    assert len(broker.do_fetch(UNIT_QUEUE, 1, woken=True)) == 1  # the last one: nobody to wake
    assert not client.exists(wake_key(broker, UNIT_QUEUE))


def test_a_token_that_cannot_be_pushed_does_not_fail_the_send(
        sending_broker: WakingRedisBroker, client: redis.Redis) -> None:
    # The wake list's key holds a string: the push fails after the message is stored. A token is
    # a hint, so the send succeeds (a consumer finds the message after its idle wait), logged.
    client.set(wake_key(sending_broker, UNIT_QUEUE), "not a list")
    probe = _probe_actor(sending_broker)
    with capture_logs() as logs:
        message = probe.send()
    assert client.lrange(f"{sending_broker.namespace}:{UNIT_QUEUE}", 0, -1) == [
        message.options["redis_message_id"].encode()]
    assert [log["event"] for log in logs] == [
        "could not wake consumers; they find the messages after their idle wait"]
    assert "WRONGTYPE" in logs[0]["error"]


# -- real worker processes -----------------------------------------------------------------------

def _spawn_waiting_worker(worker_processes: Any, *queues: str) -> Any:
    overrides = {"WORKER_IDLE_POLL_MS": IDLE_POLL_MS}
    return worker_processes.spawn(["--threads", "2", "--queues", ",".join(queues)],
                                  COMPOSITION_TEST_OVERRIDES=json.dumps(overrides))


def _start_delays(client: redis.Redis, worker: Any, send: Callable[[int], None]) -> list[float]:
    """Warm the worker up, then ``send(seq)`` SENDS times with idle gaps; each job's start minus
    the moment it was sent (s)."""
    send(-1)
    wait_until(lambda: client.llen(jobs.WAKE_STAMPS_KEY) == 1, 60, 0.1,
               message=f"the worker never ran the first job; its log:\n{worker.output()[-3000:]}")
    sent_at: dict[int, float] = {}
    for seq in range(SENDS):
        time.sleep(random.uniform(*GAP_S))
        sent_at[seq] = time.time()
        send(seq)
    wait_until(lambda: client.llen(jobs.WAKE_STAMPS_KEY) == SENDS + 1, 30, 0.1,
               message=f"not every job ran; worker log:\n{worker.output()[-3000:]}")
    started = dict(raw.decode().split() for raw in client.lrange(jobs.WAKE_STAMPS_KEY, 0, -1))
    return [float(started[str(seq)]) - sent_at[seq] for seq in range(SENDS)]


@pytest.mark.main_cell  # process timing no Python or Django version changes
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_message_sent_to_an_idle_queue_starts_before_the_next_poll(worker_processes: Any,
                                                                      client: redis.Redis) -> None:
    worker = _spawn_waiting_worker(worker_processes, jobs.WAKE_QUEUE)
    delays = _start_delays(client, worker, lambda seq: jobs.wake_stamp.send(seq=seq))
    assert statistics.median(delays) < START_BOUND_S, sorted(delays)
    assert worker.terminate() == 0


@pytest.mark.main_cell  # process timing no Python or Django version changes
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["send_on_commit", "relay"])
def test_a_message_published_through_the_outbox_starts_before_the_next_poll(
        worker_processes: Any, client: redis.Redis, request: pytest.FixtureRequest, path: str) -> None:
    # send_on_commit: the publishing process enqueues the batch right after COMMIT. relay: it only
    # nudges, and the relay in the worker (woken by the nudge) enqueues the batch.
    if path == "relay":
        request.getfixturevalue("nudge_only")
    worker = _spawn_waiting_worker(worker_processes, jobs.WAKE_QUEUE, RELAY_QUEUE_NAME)

    def send(seq: int) -> None:
        with transaction.atomic():
            publish(jobs.wake_stamp, {"seq": seq})

    try:
        delays = _start_delays(client, worker, send)
        assert statistics.median(delays) < START_BOUND_S, sorted(delays)
        assert worker.terminate() == 0
    finally:
        OutboxMessage.objects.filter(queue_name=jobs.WAKE_QUEUE).delete()
