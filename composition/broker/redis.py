"""Dramatiq's Redis broker, with consumers that wake when a message arrives instead of polling.

``WakingRedisBroker`` keeps Dramatiq's queue layout, commands, heartbeats and maintenance, and
adds a wake list per queue (``<ns>:<queue>.wake``), delay queues included: every enqueue and
requeue pushes one token per message, and an idle consumer (``redis_consumer.WakingRedisConsumer``)
waits on it in ``BLPOP`` for at most ``idle_wait_s`` instead of polling every Dramatiq timeout. A
token is a hint, never work: a stale one costs one empty fetch, a missing one one idle wait.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any
from uuid import uuid4

import redis
import structlog
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import dq_name
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message

from composition.broker.hooks import DefinedHooks
from composition.broker.keys import acks_key, lanes_key, messages_key, purging_key, queue_key
from composition.broker.priorities import LANES_LUA, PRIORITY_OPTION
from composition.broker.redis_consumer import (
    LOST_CONNECTION,
    WAKE_SUFFIX,
    WakingRedisConsumer,
    consumer_of_this_thread,
    has_wake_list,
    wake_key,
)
from composition.broker.redis_holdings import FENCED_FETCH_LUA, Holdings
from composition.broker.stand_ins import StandIns
from composition.errors import described

__all__ = ["WAKE_LUA", "WAKE_TOKENS_MAX", "WAKE_TTL_MS", "WakingRedisBroker", "requeue_as_new", "wake_args"]

log = structlog.get_logger("composition.broker")

# Tokens kept per wake list: one wakes one waiting consumer (one per worker process and queue),
# so more than the consumers of a queue only cost empty fetches.
WAKE_TOKENS_MAX = 16
# A wake list nobody pops disappears this long after its last push.
WAKE_TTL_MS = 5_000
# A wait lasts at most this share of the client's socket timeout, so a long idle wait never
# outlasts the socket and looks like a dead connection.
WAIT_SHARE_OF_SOCKET_TIMEOUT = 0.5
# BLPOP's timeout 0 means "forever": a wait is never shorter than this.
MIN_WAIT_S = 0.001
# The longest an idle consumer waits on its wake list (Dramatiq's idle poll): what a missing
# token costs. A new message's token and the worker's stop end the wait at once.
IDLE_WAIT_S = 1.0

# Lua pushing wake tokens, for any script that enqueues (the broker's own below, the outbox's
# batched enqueue): ``push_wake_tokens(first)`` reads from ARGV[first] on what ``wake_args``
# builds: max tokens, TTL in ms, the number of wake lists n, then n pairs (wake list key, tokens).
# ``push_tokens`` is the push to one wake list: at most max_tokens kept, expiring after ttl_ms.
WAKE_LUA = """
local function push_tokens(key, tokens, max_tokens, ttl_ms)
    local length = 0
    for _ = 1, tokens do
        length = redis.call("rpush", key, "1")
    end
    if length > max_tokens then
        redis.call("ltrim", key, -max_tokens, -1)
    end
    redis.call("pexpire", key, ttl_ms)
end
local function push_wake_tokens(first)
    local max_tokens = tonumber(ARGV[first])
    local ttl_ms = ARGV[first + 1]
    local last = first + 1 + 2 * tonumber(ARGV[first + 2])
    for i = first + 3, last, 2 do
        push_tokens(ARGV[i], tonumber(ARGV[i + 1]), max_tokens, ttl_ms)
    end
end
"""
_WAKE_SCRIPT = WAKE_LUA + "push_wake_tokens(1)\n"

# requeue_as_new: KEYS = this worker's unacked set of the queue, the queue's messages hash, the
# queue; ARGV = old id, new id, new body, then wake_args. Nothing happens unless the old id was
# still unacked here (the drain or a dead-worker recovery may have handed it back already).
_REQUEUE_AS_NEW_SCRIPT = WAKE_LUA + """
if redis.call("srem", KEYS[1], ARGV[1]) == 0 then
    return 0
end
redis.call("hdel", KEYS[2], ARGV[1])
redis.call("hset", KEYS[2], ARGV[2], ARGV[3])
redis.call("rpush", KEYS[3], ARGV[2])
push_wake_tokens(4)
return 1
"""

# An enqueue's wake tokens come after dispatch.lua's eight arguments and the message's two.
_ENQUEUE_WAKE_ARGS_AT = 8 + 2 + 1


def _dispatch_and_wake_lua(dispatch_lua: str) -> str:
    """Dramatiq's ``dispatch.lua`` run as a function, with the priority lanes around it
    (``composition.broker.priorities``): a "fetch" that presents the queue's fence
    (``composition.broker.redis_holdings``) first moves what the lanes should give it, an
    "enqueue" of a message with a priority then moves it from the list to the lanes (found by a
    plain search of its body first, so other messages are not decoded). Whatever it returns, an
    "enqueue" then pushes the wake tokens given after its own arguments (``wake_args``). pcall:
    the message is stored by then and a token is only a hint, so a failed push must not fail the
    send; the push's error is returned instead, to log.

    Messages that came with no token to spare wake consumers here: a fetch by a consumer a token
    woke (ARGV[11] "1") that leaves some behind wakes one more consumer (which does the same, so
    a burst reaches every idle consumer however few tokens it pushed; a busy consumer's refill
    pays nothing), and a maintenance step that finds a dead worker (whose messages it puts back)
    wakes as many as are waiting."""
    return (WAKE_LUA + LANES_LUA + "local function dramatiq_dispatch()\n" + dispatch_lua + "\nend\n"
            + FENCED_FETCH_LUA + f"""
local queue_full_name = KEYS[1] .. ":" .. ARGV[3]
local function waiting()
    return redis.call("llen", queue_full_name) + redis.call("zcard", queue_full_name .. ".lanes")
end
local function wake_waiting(tokens)
    push_tokens(queue_full_name .. "{WAKE_SUFFIX}", math.min(tokens, {WAKE_TOKENS_MAX}), {WAKE_TOKENS_MAX},
                {WAKE_TTL_MS})
end
-- Before dramatiq.lua's maintenance step takes dead workers off the heartbeats.
local dead_workers = ARGV[7] == "1" and redis.call("zcount", KEYS[1] .. ":__heartbeats__", 0,
    tonumber(ARGV[2]) - tonumber(ARGV[5])) > 0
if ARGV[1] == "fetch" then
    from_lanes(queue_full_name, math.min(tonumber(ARGV[9]), tonumber(ARGV[8])))
end
local result = dramatiq_dispatch()
if ARGV[1] == "enqueue" and string.find(ARGV[10], '"{PRIORITY_OPTION}"', 1, true) then
    local suffix = string.sub(ARGV[3], -3)
    local decoded, message = pcall(cjson.decode, ARGV[10])
    if decoded and suffix ~= ".DQ" and suffix ~= ".XQ" and type(message) == "table"
            and type(message.options) == "table" then
        local priority = tonumber(message.options["{PRIORITY_OPTION}"])
        if priority and priority ~= 0 and priority >= -100 and priority <= 100 then
            redis.call("lrem", queue_full_name, -1, ARGV[9])
            to_lanes(queue_full_name, ARGV[9], priority)
        end
    end
end
if ARGV[1] == "enqueue" then
    local woke, err = pcall(push_wake_tokens, {_ENQUEUE_WAKE_ARGS_AT})
    if not woke then
        return type(err) == "table" and err.err or tostring(err)
    end
elseif ARGV[1] == "fetch" and ARGV[11] == "1" and type(result) == "table" and #result > 0 then
    if waiting() > 0 then
        wake_waiting(1)
    end
elseif dead_workers then
    local left = waiting()
    if left > 0 then
        wake_waiting(left)
    end
end
return result
""")


def wake_args(broker: RedisBroker, queue_names: Iterable[str]) -> list[Any]:
    """``WAKE_LUA``'s arguments for messages just put on ``queue_names`` (one name per message):
    a token per message, at most ``WAKE_TOKENS_MAX`` per queue; none for dead-letter queues, and none
    at all unless ``broker`` is a ``WakingRedisBroker`` (nobody would listen)."""
    listened = isinstance(broker, WakingRedisBroker)
    counts = Counter(name for name in queue_names if has_wake_list(name)) if listened else {}
    args: list[Any] = [WAKE_TOKENS_MAX, WAKE_TTL_MS, len(counts)]
    for queue_name, count in counts.items():
        args += (wake_key(broker, queue_name), min(count, WAKE_TOKENS_MAX))
    return args


def requeue_as_new(broker: RedisBroker, redis_message_id: str, message: Message[Any]) -> bool:
    """Put a message this worker fetched and has not acknowledged (Redis id ``redis_message_id``)
    back at the end of its queue as ``message``, under a new Redis id, in one step; False, and
    nothing done, when it is no longer unacked here. Safe to repeat after a lost reply.

    Unlike ``dispatch.lua``'s requeue, which keeps the id, the worker's later acknowledgement of
    the old id cannot touch the requeued message, even if a consumer of this same worker has
    fetched it again meanwhile (see ``composition.jobs.middleware.retries.requeue_message``)."""
    new_id = str(uuid4())
    queue = message.queue_name
    body = Message(**{**message.asdict(), "options": {**message.options, "redis_message_id": new_id}}).encode()
    keys = [acks_key(broker.namespace, broker.broker_id, queue), messages_key(broker.namespace, queue),
            queue_key(broker.namespace, queue)]
    script = broker.client.register_script(_REQUEUE_AS_NEW_SCRIPT)  # no round trip: EVALSHA on call
    return bool(script(keys=keys, args=[redis_message_id, new_id, body, *wake_args(broker, [queue])]))


# Relies on Dramatiq internals (dramatiq>=2.2,<3): scripts["dispatch"] and its arguments, the
# do_<command> methods, dispatch.lua's key names; docs/architecture.md lists them.
class WakingRedisBroker(DefinedHooks, StandIns, RedisBroker):
    """Dramatiq's ``RedisBroker`` whose idle consumers wait for a wake token (see module doc).

    Takes ``RedisBroker``'s arguments. Its client's ``socket_timeout``, when set, bounds how long
    a consumer waits in one call (half of it).
    """

    def __init__(self, *, idle_wait_s: float = IDLE_WAIT_S, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        socket_timeout_s = self.client.connection_pool.connection_kwargs.get("socket_timeout")
        self.max_wait_s: float | None = (
            float(socket_timeout_s) * WAIT_SHARE_OF_SOCKET_TIMEOUT if socket_timeout_s else None)
        self.idle_wait_s = idle_wait_s
        self._wake = self.client.register_script(_WAKE_SCRIPT)
        # Every do_<command> runs scripts["dispatch"]; this one also wakes on an enqueue.
        source = self.scripts["dispatch"].script
        self.scripts["dispatch"] = self.client.register_script(
            _dispatch_and_wake_lua(source.decode() if isinstance(source, bytes) else str(source)))
        self._enqueue_wake_args: dict[str, list[Any]] = {}
        self.holdings = Holdings(self)

    @property
    def consumer_class(self) -> type[WakingRedisConsumer]:
        return WakingRedisConsumer

    def do_fetch(self, queue_name: str, prefetch: int, *, woken: bool = False) -> Any:
        """``dispatch.lua``'s fetch, presenting the queue's fence (``redis_holdings``); ``woken``:
        the consumer was woken by a token, and wakes another if it leaves messages behind."""
        return super().__getattr__("do_fetch")(queue_name, prefetch, self.holdings.fence(queue_name),
                                               "1" if woken else "0")

    def do_enqueue(self, queue_name: str, message_id: str, data: bytes) -> None:
        """``dispatch.lua``'s enqueue with the queue's wake token, in one script call.
        ``RedisBroker.enqueue`` calls it, so a send keeps all of Dramatiq's
        enqueue: the Redis id, the delay queue and ``eta``, the before/after enqueue hooks.

        The token is best effort, as ``wake`` says: a failed push is logged, never raised."""
        args = self._enqueue_wake_args.get(queue_name)
        if args is None:  # fixed per queue, and computing it is a fair share of a send's time
            args = self._enqueue_wake_args[queue_name] = wake_args(self, [queue_name])
        try:
            failure = super().__getattr__("do_enqueue")(queue_name, message_id, data, *args)
        except LOST_CONNECTION as exc:
            consumer = consumer_of_this_thread()
            if consumer is None:
                raise
            # A consumer thread moving a due delayed message: raised as itself, the thread
            # restarted its consumer keeping that message held, unacknowledged for as long as the
            # worker lived. As ConnectionClosed, it drops its delayed messages, which the queue's
            # next consumer puts back.
            consumer.connection_lost()
            raise ConnectionClosed(exc) from None
        if failure:
            log.warning("could not wake consumers; they find the messages after their idle wait",
                        error=failure.decode() if isinstance(failure, bytes) else str(failure))

    def do_requeue(self, queue_name: str, *message_ids: str) -> Any:
        """``dispatch.lua``'s requeue (what ``RedisBroker`` would answer for ``do_requeue``), then
        a wake token per message: what a draining worker hands back runs elsewhere at once."""
        result = super().__getattr__("do_requeue")(queue_name, *message_ids)
        self.wake([queue_name] * len(message_ids))
        return result

    def wake(self, queue_names: Iterable[str]) -> None:
        """Push wake tokens for messages just put on ``queue_names`` (one name per message).

        Best effort: the messages are already enqueued, and a lost token costs one idle wait, so
        a failure is logged, never raised (the caller would take it for a failed enqueue).
        """
        args = wake_args(self, queue_names)
        if args[2] == 0:
            return
        try:
            self._wake(args=args)
        except redis.RedisError as exc:
            log.warning("could not wake consumers; they find the messages after their idle wait",
                        error=described(exc))

    def wait_s(self, wait_ms: int) -> float:
        """A consumer's wait of ``wait_ms`` (for a token, or a paused queue's resume), within the
        socket timeout."""
        wait_s = wait_ms / 1000
        if self.max_wait_s is not None:
            wait_s = min(wait_s, self.max_wait_s)
        return max(wait_s, MIN_WAIT_S)

    def flush(self, queue_name: str) -> None:
        super().flush(queue_name)
        lanes = lanes_key(self.namespace, queue_name)
        self.client.delete(wake_key(self, queue_name), wake_key(self, dq_name(queue_name)), lanes, f"{lanes}.seq",
                           purging_key(self.namespace, queue_name), purging_key(self.namespace, dq_name(queue_name)))
