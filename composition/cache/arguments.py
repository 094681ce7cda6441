"""What the cache API accepts, checked where it is given: a key (a non-empty string PostgreSQL can
store, at most ``MAX_KEY_LENGTH`` characters, its namespace not empty), a namespace (the text before
a key's first ``:``), ``ttl_s`` and ``stale_ttl_s`` within a year, a jitter in [0, 1), an
``early_refresh`` that is a finite number >= 0. Anything else raises TypeError or ValueError naming
the argument, before any load."""

from __future__ import annotations

import math
from typing import Any

from composition.db.text import storable_text
from composition.seconds import checked_seconds

__all__ = ["MAX_KEY_LENGTH", "MAX_TTL_S", "check_arguments", "check_key", "check_namespace"]

# A value cached for more than a year is a mistake (1e20 s went to Redis as an out-of-range
# expiry, which was taken for an outage: served degraded, every time).
MAX_TTL_S = 365 * 86_400.0
# A longer key is a mistake (a request body or a whole URL list in it): Redis takes keys of
# megabytes, slowly, and a 40 MB one timed out and was taken for an outage (the breaker counted it
# against every key). Hash the long part into the key instead.
MAX_KEY_LENGTH = 4096


def check_arguments(key: Any, *, ttl_s: Any, jitter: Any, stale_ttl_s: Any, early_refresh: Any) -> None:
    """Raise TypeError or ValueError, naming the argument, for what ``fetch`` cannot use."""
    check_key(key)
    checked_seconds("ttl_s", ttl_s, at_most=MAX_TTL_S)
    if isinstance(jitter, bool) or not isinstance(jitter, int | float) or not 0 <= jitter < 1:
        raise ValueError(f"jitter must be in [0, 1), got {jitter!r}")
    if stale_ttl_s is not None:
        checked_seconds("stale_ttl_s", stale_ttl_s, at_most=MAX_TTL_S, zero=True)
    # Checked here, not where it is used: only a hit reads it, so a bad one passed every test
    # with a cold cache and then failed every read of a warm one.
    if isinstance(early_refresh, bool) or not isinstance(early_refresh, int | float) or not (
            math.isfinite(early_refresh) and early_refresh >= 0):
        raise ValueError(f"early_refresh is a finite number >= 0 (0 disables it), got {early_refresh!r}")


def check_key(key: Any) -> None:
    if not isinstance(key, str) or not key:
        raise TypeError(f"a cache key is a non-empty string, got {key!r}")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"a cache key is at most {MAX_KEY_LENGTH} characters (hash the long part into it), "
                         f"got {len(key)}: {_shown(key)}")
    if not storable_text(key):
        # Cached fine, then its invalidation's durable record (a PostgreSQL text) was refused.
        raise ValueError(f"a cache key is text PostgreSQL can store (no NUL, no lone surrogate), got {_shown(key)}")
    if key.startswith(":"):
        # Its namespace would be "", which invalidate_namespace() cannot name.
        raise ValueError(f"a cache key's namespace (the text before its first ':') cannot be empty, got {_shown(key)}")


def _shown(value: Any) -> str:
    """``value`` for an error message: its repr, only the start of it when long."""
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}… ({len(text)} characters)"


def check_namespace(namespace: Any) -> None:
    # A namespace is the text before a key's first ":", so one holding ":" would match no key.
    if (not isinstance(namespace, str) or not namespace or ":" in namespace or len(namespace) > MAX_KEY_LENGTH
            or not storable_text(namespace)):
        raise ValueError(f"a cache namespace is a non-empty string of at most {MAX_KEY_LENGTH} characters "
                         f"without ':', NUL or a lone surrogate, got {_shown(namespace)}")
