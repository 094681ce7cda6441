"""One cache-aside engine per cache alias, built on first use from ``COMPOSITION`` and rebuilt
when ``CACHES`` or ``COMPOSITION`` change (``override_settings`` works in tests)."""

from __future__ import annotations

import threading
from typing import Any

from django.core.cache import InvalidCacheBackendError
from django.core.signals import setting_changed

from composition.cache.engine import CacheAside
from composition.cache.errors import CacheConfigurationError
from composition.cache.serializers import load_serializer
from composition.conf import conf
from composition.errors import ConfigurationError

__all__ = ["get_cache_aside"]

_engines: dict[str, CacheAside] = {}
_default: CacheAside | None = None  # the engine of COMPOSITION['CACHE_ALIAS'], without a settings read
_engines_lock = threading.Lock()


def get_cache_aside(alias: str | None = None) -> CacheAside:
    """The engine for cache ``alias`` (default ``COMPOSITION['CACHE_ALIAS']``), built on first use.

    Raises CacheConfigurationError when the alias is unknown or not a django-redis cache, or when
    ``CACHE_BREAKER_FAILURES``/``CACHE_BREAKER_RESET_S`` are not positive.
    """
    global _default
    if alias is None and _default is not None:
        return _default
    name = alias or conf.CACHE_ALIAS
    engine = _engines.get(name)
    if engine is None:
        with _engines_lock:
            engine = _engines.get(name)
            if engine is None:
                engine = _engines[name] = _build(name)
    if alias is None:
        _default = engine
    return engine


def _build(alias: str) -> CacheAside:
    try:
        return CacheAside(
            alias,
            serializer=load_serializer(conf.CACHE_SERIALIZER),
            lease_ttl_s=float(conf.CACHE_LEASE_TTL_S),
            lease_wait_s=float(conf.CACHE_LEASE_WAIT_S),
            breaker_failures=int(conf.CACHE_BREAKER_FAILURES),
            breaker_reset_s=float(conf.CACHE_BREAKER_RESET_S),
        )
    except InvalidCacheBackendError as exc:
        raise CacheConfigurationError(f"cache alias {alias!r} is not configured: {exc}") from exc
    except ConfigurationError as exc:  # not a django-redis cache
        raise CacheConfigurationError(str(exc)) from exc
    except ValueError as exc:  # the breaker's settings (also reported by manage.py check)
        raise CacheConfigurationError(f"COMPOSITION cache settings are unusable: {exc}") from exc


def _reset(*, setting: str, **_: Any) -> None:
    global _default
    if setting in ("CACHES", "COMPOSITION"):
        with _engines_lock:
            _engines.clear()
            _default = None


setting_changed.connect(_reset, dispatch_uid="composition-cache-reset")
