"""What ``@job(concurrency=..., rate=...)`` declares: ``JobLimits``, and ``Rate`` parsed from
``"100/10s"``. Bad input is a ValueError naming the job's argument, at import time."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["JobLimits", "Rate"]

_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
# A window shorter than this cannot be kept on the Redis server's millisecond clock with meaning;
# a day is the longest a start log is worth keeping.
MIN_WINDOW_S = 0.01
MAX_WINDOW_S = 86_400.0


@dataclass(frozen=True)
class Rate:
    """At most ``starts`` starts in any window of ``window_s`` seconds."""

    starts: int
    window_s: float

    @classmethod
    def parse(cls, text: str) -> Rate:
        """``"100/10s"``, ``"5/s"``, ``"600/1m"``, ``"20/500ms"``; ValueError otherwise."""
        match = _RATE.match(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"rate={text!r} is not '<starts>/<window>' such as '100/10s', '5/s', '600/1m'")
        starts, number, unit = int(match[1]), match[2] or "1", match[3]
        rate = cls(starts, float(number) * _UNITS_S[unit])
        rate.check()
        return rate

    def check(self) -> None:
        # An int: the limiter's script counts starts in whole numbers, and refused 2.5 on every
        # start (a Redis error, taken for the limits' Redis being down) rather than here.
        if isinstance(self.starts, bool) or not isinstance(self.starts, int) or self.starts < 1:
            raise ValueError(f"a rate allows a whole number of starts per window, at least 1, got {self.starts!r}")
        if not MIN_WINDOW_S <= self.window_s <= MAX_WINDOW_S:
            raise ValueError(f"a rate's window is {MIN_WINDOW_S:g} s to {MAX_WINDOW_S:g} s, got {self.window_s!r} s")

    def __str__(self) -> str:
        return f"{self.starts}/{self.window_s:g}s"


@dataclass(frozen=True)
class JobLimits:
    """A job's limits across every worker of the cluster; None: no limit of that kind."""

    concurrency: int | None = None
    rate: Rate | None = None

    @classmethod
    def of(cls, concurrency: int | None, rate: str | Rate | None) -> JobLimits | None:
        """The limits ``@job`` was given, or None when it was given none (the common case costs
        the worker nothing)."""
        if concurrency is None and rate is None:
            return None
        if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                        or concurrency < 1):
            raise ValueError(f"concurrency must be a whole number of at least 1, got {concurrency!r}")
        if isinstance(rate, Rate):
            rate.check()
        elif rate is not None:
            rate = Rate.parse(rate)
        return cls(concurrency, rate)

    def describe(self) -> str:
        """``"5 at once, 100/10s"``, as the operations page and the logs say it."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} at once")
        if self.rate is not None:
            parts.append(f"{self.rate.starts} starts per {self.rate.window_s:g} s")
        return ", ".join(parts)
