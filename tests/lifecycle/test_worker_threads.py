"""The worker threads' component cleans up a start that failed half-way, as one does where the host
refuses threads (a container's pid limit under ``--threads 64``): the System stops only the
components that started, so the threads and consumers already running went on taking and running
jobs while the database and the broker were rolled back under them, and the messages they had
fetched waited for the dead-worker recovery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import redis

from composition.broker.keys import acks_key, messages_key
from composition.conf import conf
from tests.helpers import ROOT, unique

# The child: 20 messages queued, then the component started with 16 threads in an address space
# with room for only so many more 32 MiB thread stacks (its second argument, in MiB), so that
# thread creation fails part-way: Dramatiq starts a consumer per queue (the queue and its delay
# queue), then the worker threads.
CHILD = textwrap.dedent("""
    import json, resource, sys, threading, time
    import django
    django.setup()
    import dramatiq
    from dramatiq.message import Message
    from composition.broker.configured import build_broker
    from composition.conf import conf
    from composition.lifecycle.worker_threads import WorkerComponent

    queue = sys.argv[1]
    broker = build_broker(conf.BROKER_URL, heartbeat_timeout_s=60.0, maintenance_chance=0, middleware=[])
    broker.declare_queue(queue)
    ran = []

    @dramatiq.actor(broker=broker, queue_name=queue, actor_name=queue + "_probe")
    def probe(n):
        ran.append(n)

    for n in range(20):
        broker.enqueue(Message(queue_name=queue, actor_name=queue + "_probe", args=(n,), kwargs={}, options={}))
    component = WorkerComponent(broker, queue_order=None, threads=16, idle_poll_ms=100)
    threading.stack_size(32 * 2**20)
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + int(sys.argv[2]) * 2**20, resource.RLIM_INFINITY))
    began = time.monotonic()
    try:
        component.start()
        failure = None
    except BaseException as exc:
        failure = repr(exc)
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    took = time.monotonic() - began
    time.sleep(0.2)
    alive = [type(thread).__name__ for thread in threading.enumerate()
             if type(thread).__name__ in ("WorkerThread", "ConsumerThread") and thread.is_alive()]
    print(json.dumps({"failure": failure, "alive": alive, "ran": ran, "took": took,
                      "broker_id": broker.broker_id, "namespace": broker.namespace}))
""")


@pytest.mark.parametrize("room_mib", [40, 160], ids=["a-consumer-refused", "a-worker-thread-refused"])
def test_a_start_that_fails_part_way_stops_the_threads_it_started_and_hands_their_messages_back(room_mib: int) -> None:
    queue = unique("worker_threads")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    child = subprocess.run([sys.executable, "-c", CHILD, queue, str(room_mib)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr[-3000:]
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    client = redis.Redis.from_url(conf.BROKER_URL)
    try:
        held = client.scard(acks_key(seen["namespace"], seen["broker_id"], queue))
        bodies = client.hlen(messages_key(seen["namespace"], queue))
        for key in client.scan_iter(f"{seen['namespace']}:*{queue}*"):
            client.delete(key)
    finally:
        client.close()

    assert seen["failure"] is not None and "can't start new thread" in seen["failure"], seen
    assert seen["alive"] == [], f"still running after the failed start: {seen}"
    assert "not cleaned up" not in child.stdout + child.stderr, child.stderr[-3000:]
    assert seen["took"] < 5
    # Every message ran once, or is back on its queue now: none is held by the
    # failed process for the dead-worker recovery to find later.
    assert held == 0, seen
    assert len(seen["ran"]) + bodies == 20, (seen, bodies)
    assert len(set(seen["ran"])) == len(seen["ran"])
