"""Reading the environment: database URLs into Django's DATABASES entry."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


def database_from_url(url: str, engine: str = "django.db.backends.postgresql") -> dict[str, Any]:
    """``postgresql://user:pass@host:port/name?host=/socket/dir`` as a DATABASES entry using
    ``engine`` (a PostgreSQL backend, such as django-prometheus's, which adds query metrics)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"DATABASE_URL must be a postgresql:// URL, got scheme {parts.scheme!r}")
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    host = query.pop("host", None) or unquote(parts.hostname or "")
    return {
        "ENGINE": engine,
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(parts.port or ""),
        "OPTIONS": query,
    }


def env_bool(value: str | None, default: bool = False) -> bool:
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")
