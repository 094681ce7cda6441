"""What a worker's Redis consumers hold, so that what its unacknowledged set holds beyond that
goes back to its queue after a lost connection, instead of waiting for the worker's restart.

After a consumer of a queue lost its connection, the queue's next consumer first fences the
queue (every fetch presents the queue's fence: one sent before, arriving late, takes nothing)
and puts back every id of the worker's unacknowledged set that its consumers do not hold.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import structlog

from composition.broker.keys import acks_key, fence_key

if TYPE_CHECKING:
    from collections.abc import Iterable

    from composition.broker.redis import WakingRedisBroker

__all__ = ["FENCED_FETCH_LUA", "FENCE_TTL_MS", "Holdings"]

log = structlog.get_logger("composition.broker")

# A fence key expires this long after the worker last fenced the queue. An absent key lets every
# fetch through, so expiry costs nothing but protection from a fetch delayed longer than this.
FENCE_TTL_MS = 86_400_000

# Runs first in the dispatch script: a fetch (ARGV[9] its prefetch, ARGV[10] its fence) takes
# nothing unless it presents the queue's fence; dispatch.lua's ARGV[3] is the queue, ARGV[4] the
# worker id, KEYS[1] the namespace.
FENCED_FETCH_LUA = """
if ARGV[1] == "fetch" and ARGV[10] then
    local fence = redis.call("get", KEYS[1] .. ":__fence__." .. ARGV[4] .. "." .. ARGV[3])
    if fence and fence ~= ARGV[10] then
        return {}
    end
end
"""

# KEYS = the queue's fence, this worker's unacknowledged set of the queue; ARGV = FENCE_TTL_MS.
_FENCE_AND_LIST_SCRIPT = """
local fence = redis.call("incr", KEYS[1])
redis.call("pexpire", KEYS[1], ARGV[1])
return {fence, redis.call("smembers", KEYS[2])}
"""


# Why: Dramatiq's fetch moves ids into the worker's unacknowledged set (__acks__) and answers with
# their bodies. When the answer never arrives (Redis stalled or the network was cut after the
# fetch ran, or a fetch sent before a stall ran after the client gave up), the ids sit in that set
# with no consumer holding them; the worker still beats, so no other worker's maintenance takes
# them back. So are the delayed messages a consumer thread drops, with its delay queue, when its
# connection is lost.
class Holdings:
    """The Redis ids a worker's consumers handed out and have not acked, nacked or put back, per
    queue; the queues whose consumer lost its connection since; and each queue's fence."""

    def __init__(self, broker: WakingRedisBroker) -> None:
        self._broker = broker
        self._held: dict[str, set[str]] = {}
        self._unsure: set[str] = set()
        self._fences: dict[str, str] = {}
        self._lock = threading.Lock()
        self._fence_and_list = broker.client.register_script(_FENCE_AND_LIST_SCRIPT)

    def held(self, queue_name: str) -> set[str]:
        """The ids held from ``queue_name``: a consumer adds what it hands out and removes what
        it settles (the same set for every consumer of the queue)."""
        with self._lock:
            return self._held.setdefault(queue_name, set())

    def fence(self, queue_name: str) -> str:
        return self._fences.get(queue_name, "0")

    def lost(self, queue_name: str, dropped: Iterable[str] = ()) -> None:
        """A consumer of ``queue_name`` lost its connection, dropping the ids ``dropped``."""
        held = self.held(queue_name)
        for redis_id in list(dropped):
            held.discard(redis_id)
        with self._lock:
            self._unsure.add(queue_name)

    def put_back_unheld(self, queue_name: str) -> None:
        """After a lost connection on ``queue_name``: fence it, then requeue what this worker's
        unacknowledged set holds beyond what its consumers do. Raises, staying unsure, when Redis
        does not answer. Cheap otherwise: called before every fetch."""
        if not self._unsure or queue_name not in self._unsure:
            return
        with self._lock:
            if queue_name not in self._unsure:
                return
            broker = self._broker
            fence, unacked = self._fence_and_list(
                keys=[fence_key(broker.namespace, broker.broker_id, queue_name),
                      acks_key(broker.namespace, broker.broker_id, queue_name)],
                args=[FENCE_TTL_MS])
            self._fences[queue_name] = str(fence)
            # An id settled meanwhile by a worker thread has left the set in Redis first: the
            # requeue, which moves only ids still in it, skips it.
            unheld = sorted({_text(redis_id) for redis_id in unacked} - self._held.get(queue_name, set()))
            if unheld:
                broker.do_requeue(queue_name, *unheld)
                log.warning("messages fetched for no consumer put back after a lost connection",
                            queue=queue_name, count=len(unheld))
            self._unsure.discard(queue_name)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
