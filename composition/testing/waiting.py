"""Waiting and ports: the small helpers every real-process test needs."""

from __future__ import annotations

import socket
import time
from typing import Any

__all__ = ["free_port", "http_status", "wait_until"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_status(url: str, timeout_s: float = 2.0) -> int:
    """The HTTP status ``url`` answers with, or 0 when nothing answers."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.05, message: str = "") -> None:
    """Poll ``predicate`` until it is truthy; raise AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(message or f"condition not met within {timeout_s}s")


