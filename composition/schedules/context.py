"""Inside a scheduled run: which tick it is (``current_fire_at``), and whether a catch-up."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from composition.jobs.current import current_message
from composition.schedules.declaration import SCHEDULE_HEADER

__all__ = ["current_fire_at", "current_tick_is_catch_up", "schedule_header"]


def schedule_header(options: dict[str, Any]) -> dict[str, Any] | None:
    """The schedule header of a message's options, or None for a message no schedule sent."""
    headers = options.get("composition")
    header = headers.get(SCHEDULE_HEADER) if isinstance(headers, dict) else None
    return header if isinstance(header, dict) else None


def _current() -> dict[str, Any] | None:
    message = current_message()
    return None if message is None else schedule_header(message.options)


def current_fire_at() -> datetime | None:
    """The tick the running job was fired for (an aware UTC datetime; for ``schedules run``, when
    it was run); None outside a scheduled run. Key a job's effects on it to make them once per
    tick."""
    header = _current()
    return None if header is None else datetime.fromisoformat(header["fire_at"])


def current_tick_is_catch_up() -> bool:
    """Whether the running job is a missed tick fired late by the catch-up policy."""
    header = _current()
    return bool(header and header.get("catch_up"))
