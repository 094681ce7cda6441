"""What the cache API accepts, checked where it is given: a key (a non-empty string PostgreSQL can
store, its namespace not empty), a namespace (the text before a key's first ``:``), ``ttl_s`` and
``stale_ttl_s`` within a year, a jitter in [0, 1). Anything else raises TypeError or ValueError
naming the argument, before any load."""

from __future__ import annotations

from typing import Any

from composition.db.text import storable_text
from composition.seconds import checked_seconds

__all__ = ["MAX_TTL_S", "check_arguments", "check_key", "check_namespace"]

# A value cached for more than a year is a mistake (1e20 s went to Redis as an out-of-range
# expiry, which was taken for an outage: served degraded, every time).
MAX_TTL_S = 365 * 86_400.0


def check_arguments(key: Any, *, ttl_s: Any, jitter: Any, stale_ttl_s: Any) -> None:
    """Raise TypeError or ValueError, naming the argument, for what ``fetch`` cannot use."""
    check_key(key)
    checked_seconds("ttl_s", ttl_s, at_most=MAX_TTL_S)
    if isinstance(jitter, bool) or not isinstance(jitter, int | float) or not 0 <= jitter < 1:
        raise ValueError(f"jitter must be in [0, 1), got {jitter!r}")
    if stale_ttl_s is not None:
        checked_seconds("stale_ttl_s", stale_ttl_s, at_most=MAX_TTL_S, zero=True)


def check_key(key: Any) -> None:
    if not isinstance(key, str) or not key:
        raise TypeError(f"a cache key is a non-empty string, got {key!r}")
    if not storable_text(key):
        # Cached fine, then its invalidation's durable record (a PostgreSQL text) was refused.
        raise ValueError(f"a cache key is text PostgreSQL can store (no NUL, no lone surrogate), got {key!r}")
    if key.startswith(":"):
        # Its namespace would be "", which invalidate_namespace() cannot name.
        raise ValueError(f"a cache key's namespace (the text before its first ':') cannot be empty, got {key!r}")


def check_namespace(namespace: Any) -> None:
    # A namespace is the text before a key's first ":", so one holding ":" would match no key.
    if not isinstance(namespace, str) or not namespace or ":" in namespace or not storable_text(namespace):
        raise ValueError("a cache namespace is a non-empty string without ':', NUL or a lone surrogate, "
                         f"got {namespace!r}")
