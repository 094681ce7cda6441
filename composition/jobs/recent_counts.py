"""``RecentCounts``: how many events of each kind happened in the last few minutes, in
one-second buckets, so a rate costs a few hundred integers per kind however busy the process is."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["RecentCounts"]


class RecentCounts:
    """Events per kind over the last ``window_s`` seconds (thread-safe)."""

    def __init__(self, window_s: float = 300.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, deque[list[int]]] = {}  # kind -> [second, count], oldest first

    def add(self, kind: str, count: int = 1) -> None:
        second = int(self._clock())
        with self._lock:
            buckets = self._buckets.setdefault(kind, deque())
            if buckets and buckets[-1][0] == second:
                buckets[-1][1] += count
            else:
                buckets.append([second, count])
            self._drop_old(buckets, second)

    def totals(self) -> dict[str, int]:
        """Kind → events within the window (kinds with none left out)."""
        now = int(self._clock())
        with self._lock:
            result = {}
            for kind, buckets in self._buckets.items():
                self._drop_old(buckets, now)
                total = sum(count for _, count in buckets)
                if total:
                    result[kind] = total
            return result

    def _drop_old(self, buckets: deque[list[int]], now: int) -> None:
        horizon = now - int(self.window_s)
        while buckets and buckets[0][0] <= horizon:
            buckets.popleft()
