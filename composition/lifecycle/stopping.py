"""Bounded calls: a stop (or drain hook) runs in a helper thread and is abandoned at its timeout."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from composition.errors import described
from composition.lifecycle.base import Component

__all__ = ["StopResult", "call_with_timeout", "stop_with_timeout"]


@dataclass(frozen=True)
class StopResult:
    """How one component stopped: ``status`` is "stopped", "failed", "timeout", or "died" (it
    ended on its own while the system ran)."""

    name: str
    status: str
    duration_s: float
    error: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "status": self.status, "duration_s": round(self.duration_s, 4),
                "error": self.error}


def stop_with_timeout(component: Component, timeout_s: float) -> StopResult:
    """Run ``component.stop`` in a helper thread and give up on it after ``timeout_s``."""
    return call_with_timeout(component.name, lambda: component.stop(timeout_s), timeout_s)


def call_with_timeout(name: str, call: Callable[[], object], timeout_s: float) -> StopResult:
    """Run ``call`` in a daemon thread; "stopped" when it returned, "failed" when it raised,
    "timeout" (and abandoned) when it was still running after ``timeout_s``. Where no thread
    can be started, ``call`` runs in the calling thread, unbounded."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    began = time.monotonic()
    thread = threading.Thread(target=target, name=f"stop-{name}", daemon=True)
    try:
        thread.start()
    except RuntimeError:
        # No thread to be had (a container's pid limit, what may have failed the start this
        # stop rolls back): the call runs here, without its bound, rather than not at all.
        target()
    else:
        thread.join(timeout_s)
    took = time.monotonic() - began
    if thread.is_alive():
        return StopResult(name, "timeout", took, f"did not return within {timeout_s:.1f}s")
    error = outcome[0] if outcome else None
    if error is not None:
        return StopResult(name, "failed", took, described(error))
    return StopResult(name, "stopped", took)
