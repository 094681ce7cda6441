"""Serializers for cache_aside values: ``dumps(value) -> bytes`` and ``loads(bytes) -> value``.

JSON is the default on purpose: a cache can be written by anyone who reaches Redis, and
unpickling such bytes runs their code. JSON round-trips dicts, lists, strings, numbers, booleans
and None; Decimal, datetime, date, time, timedelta and UUID are written as strings (Django's
encoder) and come back as strings.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from django.core.serializers.json import DjangoJSONEncoder
from django.utils.module_loading import import_string

from composition.cache.errors import CacheConfigurationError

__all__ = ["JSONSerializer", "Serializer", "load_serializer"]


class Serializer(Protocol):
    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class JSONSerializer:
    """Compact UTF-8 JSON. ``dumps`` raises TypeError for a value JSON cannot represent."""

    def __init__(self) -> None:
        self._encoder = DjangoJSONEncoder(separators=(",", ":"), ensure_ascii=False)

    def dumps(self, value: Any) -> bytes:
        return self._encoder.encode(value).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


def load_serializer(path: str) -> Serializer:
    """Instantiate the serializer class at ``path``; CacheConfigurationError names a bad path."""
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise CacheConfigurationError(f"COMPOSITION['CACHE_SERIALIZER'] {path!r} cannot be imported: {exc}") \
            from exc
    serializer = cls()
    if not (callable(getattr(serializer, "dumps", None)) and callable(getattr(serializer, "loads", None))):
        raise CacheConfigurationError(f"COMPOSITION['CACHE_SERIALIZER'] {path!r} has no dumps()/loads().")
    return serializer
