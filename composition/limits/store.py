"""The limits' state on the cache's Redis, changed only by scripts that read the server's clock.

Per job (``<prefix><actor>:``): ``slots``, a sorted set of the concurrency leases (owner token →
expiry, ms on the Redis server's clock) with ``started`` (token → start) beside it; ``starts``,
the rate's log of starts in the last window; ``meta``, the job's mean and last run times, the
end of each waiting line, and how many starts each limit delayed. A start over a limit is told when to come
back: its turn in that limit's waiting line.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.core.cache import caches
from django.core.signals import setting_changed

from composition.conf import conf, redis_client_of
from composition.limits.declared import JobLimits

__all__ = ["Admission", "LimitState", "LimitStore", "limit_store"]

# A refused start's turn is spaced at TURNS_PER_FREED_START times the pace at which the limit
# frees a start (a concurrency limit frees one every mean run time ÷ N, taken as at most twice
# the last run's but at least an eighth of the mean; a rate one every window ÷ starts), from the
# earliest moment one can free (the first running job's expected end: its start plus the mean run
# time, or twice what it has run so far once past that; the oldest logged start leaving the
# window). Turns closer than the pace keep a freed start from waiting long for someone to take it;
# a start refused again takes the next turn, and turns only move forward, so the waiting ones come
# back at a bounded pace, never in a loop. A turn further away than LIMIT_MAX_DELAY_S comes back
# after that long without advancing the line. Each turn costs a put-back (a few milliseconds of a
# worker thread) when refused, and a freed start waits half a turn on average for the next one.
TURNS_PER_FREED_START = 3
# A rate's margin: the start is logged when the limiter admits it, the job's first line runs a
# moment later, and a window measured from there must hold too.
RATE_MARGIN_SHARE = 0.01
RATE_MARGIN_MIN_MS = 20
# What a job's run time is taken to be until one has ended.
FIRST_MEAN_RUN_MS = 1000
# The mean run time follows each ended run by this share.
MEAN_WEIGHT = 0.2

_NOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

# KEYS: slots, started, starts, meta. ARGV: token, concurrency (0: none), ttl ms, rate starts
# (0: none), window ms (with its margin), first mean run ms, max delay ms, turns per freed start.
# Returns {1, now ms, ''} (started: a slot
# held by token, a start logged at now) or {0, delay ms, kind}.
_ADMIT = _NOW + """
local token = ARGV[1]
local concurrency, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local rate, window = tonumber(ARGV[4]), tonumber(ARGV[5])
local max_delay = tonumber(ARGV[7])
local turns = tonumber(ARGV[8])
local function come_back(kind, earliest, spacing)
  redis.call('HINCRBY', KEYS[4], 'delayed:' .. kind, 1)
  local line = tonumber(redis.call('HGET', KEYS[4], 'line:' .. kind) or '0')
  local turn = math.max(earliest, now, line + spacing)
  if turn - now > max_delay then return {0, max_delay, kind} end
  redis.call('HSET', KEYS[4], 'line:' .. kind, math.floor(turn))
  return {0, math.floor(turn - now), kind}
end
if concurrency > 0 then
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    redis.call('HDEL', KEYS[2], unpack(expired))
  end
  if redis.call('ZCARD', KEYS[1]) >= concurrency then
    local run = redis.call('HMGET', KEYS[4], 'mean_run_ms', 'last_run_ms')
    local mean = tonumber(run[1] or ARGV[6])
    -- The mean follows a change of pace slowly: a job whose runs got short (20 s, then 0.2 s) kept
    -- the waiting ones away for the old mean while its slots stood free. Twice the last run bounds
    -- it, down to an eighth of the mean: one run that ended at once (a quick failure) must not send
    -- the whole line back every few milliseconds.
    if run[2] then mean = math.max(math.min(mean, 2 * tonumber(run[2])), mean / 8) end
    local first_end = nil
    for _, started in ipairs(redis.call('HVALS', KEYS[2])) do
      started = tonumber(started)
      -- A run past its mean is expected to take as long again as it has so far: its expected
      -- end never lies in the past, where every refused start would come back at once.
      local expected = started + math.max(mean, 2 * (now - started))
      if first_end == nil or expected < first_end then first_end = expected end
    end
    return come_back('concurrency', first_end or now, mean / (turns * concurrency))
  end
end
if rate > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - window)
  local logged = redis.call('ZCARD', KEYS[3])
  if logged >= rate then
    -- The start that must leave the window before one more fits in it.
    local leaving = redis.call('ZRANGE', KEYS[3], logged - rate, logged - rate, 'WITHSCORES')
    return come_back('rate', tonumber(leaving[2]) + window + 1, window / (turns * rate))
  end
  redis.call('ZADD', KEYS[3], now, token)
  redis.call('PEXPIRE', KEYS[3], window + 1000)
end
if concurrency > 0 then
  redis.call('ZADD', KEYS[1], now + ttl, token)
  redis.call('HSET', KEYS[2], token, now)
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return {1, now, ''}
"""

# KEYS: slots, started, meta, starts. ARGV: token, mean weight, refund (1: the run did not run
# its body: its start leaves the rate's window, and its time is no run time). Frees the slot if
# token still holds it and folds the run's time into the mean. Returns 1 when it held it, 0 when
# it had expired (or held none).
_RELEASE = _NOW + """
local started = redis.call('HGET', KEYS[2], ARGV[1])
local held = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[4], ARGV[1])
elseif started and held == 1 then
  local ran = now - tonumber(started)
  local mean = redis.call('HGET', KEYS[3], 'mean_run_ms')
  redis.call('HSET', KEYS[3], 'last_run_ms', math.floor(ran))
  if mean then ran = (1 - ARGV[2]) * tonumber(mean) + ARGV[2] * ran end
  redis.call('HSET', KEYS[3], 'mean_run_ms', math.floor(ran))
end
return held
"""

# KEYS: slots, started. ARGV: ttl ms, tokens... Pushes each still-held lease's expiry to now +
# ttl; returns the tokens that no longer held theirs (expired: the slot may be someone else's).
_RENEW = _NOW + """
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i])
  else
    table.insert(lost, ARGV[i])
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return lost
"""

# KEYS: slots, starts, meta. ARGV: window ms (0: no rate). Returns {slots held, starts in the
# window, delayed by concurrency, delayed by rate, mean run ms or -1}.
_STATE = _NOW + """
local held = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
local starts = 0
if tonumber(ARGV[1]) > 0 then starts = redis.call('ZCOUNT', KEYS[2], '(' .. (now - tonumber(ARGV[1])), '+inf') end
local meta = redis.call('HMGET', KEYS[3], 'delayed:concurrency', 'delayed:rate', 'mean_run_ms')
return {held, starts, tonumber(meta[1] or '0'), tonumber(meta[2] or '0'), tonumber(meta[3] or '-1')}
"""


@dataclass(frozen=True)
class Admission:
    """A start allowed (``started``, logged at ``at_s`` on the Redis server's clock), or the delay
    before trying again and the limit (``kind``: ``concurrency`` or ``rate``) that refused it."""

    started: bool
    delay_s: float = 0.0
    kind: str = ""
    at_s: float = 0.0


@dataclass(frozen=True)
class LimitState:
    """One job's limits as the cluster holds them now."""

    slots_held: int
    starts_in_window: int
    delayed_by_concurrency: int
    delayed_by_rate: int
    mean_run_s: float | None


class LimitStore:
    """The scripts above on one Redis client, under one key prefix."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._admit = client.register_script(_ADMIT)
        self._release = client.register_script(_RELEASE)
        self._renew = client.register_script(_RENEW)
        self._state = client.register_script(_STATE)

    def _keys(self, actor: str, *names: str) -> list[str]:
        return [f"{self.prefix}{actor}:{name}" for name in names]

    def admit(self, actor: str, limits: JobLimits, token: str) -> Admission:
        """Start one run of ``actor`` under ``limits`` as ``token``, or say when to try again.
        Raises the client's errors (the caller decides what an unreachable store means)."""
        rate = limits.rate
        started, value_ms, kind = self._admit(
            keys=self._keys(actor, "slots", "started", "starts", "meta"),
            args=[token, limits.concurrency or 0, _ms(float(conf.LIMIT_SLOT_TTL_S)),
                  rate.starts if rate else 0, _window_ms(rate.window_s) if rate else 0,
                  FIRST_MEAN_RUN_MS, _ms(float(conf.LIMIT_MAX_DELAY_S)), TURNS_PER_FREED_START])
        if started:
            return Admission(True, at_s=int(value_ms) / 1000)
        return Admission(False, int(value_ms) / 1000, kind.decode() if isinstance(kind, bytes) else str(kind))

    def release(self, actor: str, token: str, *, refund: bool = False) -> bool:
        """Free ``token``'s slot; False when it had expired (the run outlived its lease). With
        ``refund``, the run did not run its body (refused by the deploy window): its start is
        taken off the rate's count too."""
        return bool(self._release(keys=self._keys(actor, "slots", "started", "meta", "starts"),
                                  args=[token, MEAN_WEIGHT, 1 if refund else 0]))

    def renew(self, actor: str, tokens: Iterable[str]) -> list[str]:
        """Extend the leases of ``tokens``; returns those that had expired."""
        tokens = list(tokens)
        if not tokens:
            return []
        lost = self._renew(keys=self._keys(actor, "slots", "started"),
                           args=[_ms(float(conf.LIMIT_SLOT_TTL_S)), *tokens])
        return [token.decode() if isinstance(token, bytes) else str(token) for token in lost]

    def state(self, actor: str, limits: JobLimits) -> LimitState:
        window_ms = _ms(limits.rate.window_s) if limits.rate else 0
        held, starts, by_concurrency, by_rate, mean_ms = self._state(
            keys=self._keys(actor, "slots", "starts", "meta"), args=[window_ms])
        return LimitState(int(held), int(starts), int(by_concurrency), int(by_rate),
                          None if int(mean_ms) < 0 else int(mean_ms) / 1000)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _window_ms(window_s: float) -> int:
    """A rate's window with its margin (module doc)."""
    window_ms = _ms(window_s)
    return window_ms + max(RATE_MARGIN_MIN_MS, round(window_ms * RATE_MARGIN_SHARE))


_stores: dict[str, LimitStore] = {}
_stores_lock = threading.Lock()


def limit_store() -> LimitStore:
    """The store on the cache ``COMPOSITION['CACHE_ALIAS']`` (django-redis), as the locks use."""
    alias = conf.CACHE_ALIAS
    store = _stores.get(alias)
    if store is None:
        with _stores_lock:
            store = _stores.get(alias)
            if store is None:
                cache: Any = caches[alias]
                store = _stores[alias] = LimitStore(redis_client_of(alias, "@job(concurrency=, rate=)"),
                                                    str(cache.make_key("composition:limit:")))
    return store


def _forget(*, setting: str, **_: Any) -> None:
    if setting in ("CACHES", "COMPOSITION"):
        with _stores_lock:
            _stores.clear()


setting_changed.connect(_forget, dispatch_uid="composition-limit-store-reset")
