"""Reading the environment: database URLs into Django's DATABASES entry, and what one ``./run``
instance keeps apart from another's (one per port)."""

from __future__ import annotations

import os
from pathlib import Path
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


def serving_port() -> int:
    """The port ``./run`` serves on (``PORT``, 8000): its instance, beside others on other ports.
    Raises ValueError, naming the variable, for anything but a port number."""
    given = os.environ.get("PORT") or "8000"
    port = int(given) if given.isdigit() else 0
    if not 1 <= port <= 65535:
        raise ValueError(f"PORT must be a port number from 1 to 65535, got {given!r}")
    return port


def drain_file(data_dir: Path) -> Path:
    """The draining mark of the web server on ``serving_port()`` (``DRAIN_FILE`` overrides):
    ``PORT=8001 ./manage.py drain`` drains that ``./run``'s web server, and only that one."""
    return Path(os.environ.get("DRAIN_FILE") or data_dir / f"web-{serving_port()}.draining")
