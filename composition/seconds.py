"""A duration argument checked where it is given: a number of seconds, finite and within the
bounds its use can hold, else a ValueError that names the argument (nan, inf or 1e20 failed far
from the call, as a Redis or PostgreSQL range error taken for an outage)."""

from __future__ import annotations

from typing import Any

__all__ = ["checked_seconds"]


def checked_seconds(name: str, value: Any, *, at_most: float, zero: bool = False) -> float:
    """``value`` as a float when it is a number of seconds above 0 (from 0 with ``zero``) and at
    most ``at_most``; raises ValueError naming ``name`` otherwise (a bool is not a number here)."""
    # The comparisons refuse nan and inf too, and compare a huge int exactly.
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not (value >= 0 if zero else value > 0) or not value <= at_most:
        low = "from 0" if zero else "above 0"
        raise ValueError(f"{name} must be a number of seconds {low} and at most {at_most:g}, got {value!r}")
    return float(value)
