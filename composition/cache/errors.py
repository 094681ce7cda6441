"""Errors of composition.cache. A Redis outage is not an error here: cache_aside degrades to the
loader. What remains are configuration mistakes."""

from __future__ import annotations

from composition.errors import ConfigurationError

__all__ = ["CacheConfigurationError"]


class CacheConfigurationError(ConfigurationError):
    """The cache alias or the serializer setting is unusable."""
