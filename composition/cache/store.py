"""The Redis side of cache_aside: key names, the entry format and the scripted lease protocol.

Under one cache alias's prefix a cached key has three Redis keys: its entry, its rebuild lease
(an owner token with a short TTL) and its namespace's version (missing means ``0``), and the alias
one epoch. An entry is ``b"<epoch>/<namespace version>|<fresh until, unix ms>|<rebuild ms>|<payload>"``;
it counts only while both are current: bumping the version invalidates the namespace, and a new
epoch (``ensure_epoch``, after Redis restarted, maybe from a snapshot older than invalidations
it had applied) every entry.
Each check and the write it guards run as one Lua script (``composition.cache._scripts``), so
no other client's command can come between them. Redis errors propagate: the caller degrades.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from composition.cache._scripts import ACQUIRE, ENSURE_EPOCH, FILL, RELEASE
from composition.cache.results import namespace_of

__all__ = ["BUSY", "FRESH", "LEASED", "Entry", "KeySpace", "LeaseStore", "decode_entry", "encode_entry", "version_of"]

# What ACQUIRE found: a fresh entry, a lease granted to the caller, or a lease someone else holds.
FRESH, LEASED, BUSY = 0, 1, 2


class KeySpace:
    """Redis key names of cache_aside: entry, rebuild lease, namespace version and epoch."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.epoch = f"{prefix}epoch"

    def of(self, key: str) -> tuple[str, str, str, str]:
        """The (namespace, entry, lease, epoch) keys of the cached ``key``, as the scripts take them."""
        return self.namespace(namespace_of(key)), self.entry(key), self.lease(key), self.epoch

    def entry(self, key: str) -> str:
        return f"{self.prefix}e:{key}"

    def lease(self, key: str) -> str:
        return f"{self.prefix}l:{key}"

    def namespace(self, namespace: str) -> str:
        return f"{self.prefix}n:{namespace}"


class Entry(NamedTuple):
    fresh_until_ms: int
    rebuild_ms: int
    payload: bytes


def version_of(epoch_raw: bytes | None, ns_raw: bytes | None) -> bytes:
    """The version an entry must carry to count, from the epoch and namespace values as read."""
    return (epoch_raw or b"") + b"/" + (ns_raw or b"0")


def decode_entry(raw: bytes | None, version: bytes) -> Entry | None:
    """The entry, or None when absent, written under another version (``version_of``), or not one."""
    if raw is None:
        return None
    parts = raw.split(b"|", 3)
    if len(parts) != 4 or parts[0] != version or not parts[1].isdigit() or not parts[2].isdigit():
        return None  # not an entry of ours (written by something else): absent, and refilled
    return Entry(int(parts[1]), int(parts[2]), parts[3])


def encode_entry(version: bytes, fresh_until_ms: int, rebuild_ms: int, payload: bytes) -> bytes:
    return b"%s|%d|%d|" % (version, fresh_until_ms, rebuild_ms) + payload


class LeaseStore:
    """The lease protocol's scripts on one Redis ``client`` (bytes replies). ``keys`` arguments
    are the (namespace, entry, lease, epoch) Redis keys of one cached key (``KeySpace.of``)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._acquire = client.register_script(ACQUIRE)
        self._fill = client.register_script(FILL)
        self._release = client.register_script(RELEASE)
        self._ensure_epoch = client.register_script(ENSURE_EPOCH)

    def acquire(self, keys: tuple[str, str, str, str], token: str, lease_ms: int, *,
                rebuild_even_if_fresh: bool) -> tuple[int, bytes, Entry | None]:
        """(status, version, entry): ``FRESH`` with the fresh entry (never when
        ``rebuild_even_if_fresh``); ``LEASED`` when ``token`` now holds the rebuild lease for
        ``lease_ms``; ``BUSY`` when someone else holds it. The entry is given only when FRESH."""
        status, version, raw = self._acquire(
            keys=keys, args=[token, lease_ms, int(time.time() * 1000), "1" if rebuild_even_if_fresh else "0"])
        return status, version, decode_entry(raw, version) if status == FRESH else None

    def fill(self, keys: tuple[str, str, str, str], token: str, version: bytes, entry: bytes, expire_ms: int) -> bool:
        """Store ``entry`` for ``expire_ms`` and give the lease back, only while ``token`` still
        holds the lease and the version is still ``version``; False when refused."""
        return bool(self._fill(keys=keys, args=[token, version, entry, expire_ms]) == 1)

    def holds(self, keys: tuple[str, str, str, str], token: str, version: bytes) -> bool:
        """Whether ``token`` still holds the lease and the version is still ``version`` (no
        invalidation since it was taken: the fill would be accepted)."""
        ns_now, holder, epoch_now = self._client.execute_command("MGET", keys[0], keys[2], keys[3])
        return bool(holder == token.encode() and version_of(epoch_now, ns_now) == version)

    def ensure_epoch(self, epoch_key: str, token: str, last: bytes) -> tuple[bool, bytes]:
        """Install a new epoch (``token``) unless the running Redis server installed the current
        one (``last``, the epoch the caller read before, comes back if the key was lost on the same
        server); (whether it installed one: every entry cached before is a miss from now on, the
        epoch)."""
        installed, epoch = self._ensure_epoch(keys=[epoch_key], args=[token, last])
        return installed == 1, epoch

    def release(self, lease_key: str, token: str) -> None:
        """Give the lease back unless it has passed to someone else."""
        self._release(keys=[lease_key], args=[token])
