"""``CircuitBreaker``: stop calling a dependency that keeps failing, and let it recover.

Closed: calls go through; ``failure_threshold`` consecutive failures open it. Open: calls are
refused for ``reset_timeout_s``. Then half-open: the next ``half_open_max_calls`` callers, or with
``probe=`` a background ``probe()`` alone, decide whether it closes or opens again. Thread-safe;
the closed path takes no lock, since every cache hit passes through it. ``CircuitOpen`` is a
``TransientError``, so a job that hits an open circuit retries later.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import structlog

from composition.errors import TransientError
from composition.metrics import CIRCUIT_REJECTIONS_TOTAL, CIRCUIT_STATE
from composition.seconds import checked_seconds

__all__ = ["CircuitBreaker", "CircuitOpen", "breaker_states"]

log = structlog.get_logger("composition.backpressure")  # where its state changes were always logged

P = ParamSpec("P")
R = TypeVar("R")

_CLOSED, _HALF_OPEN, _OPEN = "closed", "half_open", "open"
_STATE_VALUES = {_CLOSED: 0, _HALF_OPEN: 1, _OPEN: 2}
# A breaker open for more than a week is a mistake.
MAX_RESET_TIMEOUT_S = 7 * 86_400.0

# Every breaker of this process, for the heartbeat and the operations page; weak, so a breaker
# that is dropped (a test's, a reconfigured cache's) leaves it.
_breakers: weakref.WeakSet[CircuitBreaker] = weakref.WeakSet()


def breaker_states() -> dict[str, str]:
    """Name → state of this process's breakers; for a name several breakers share, the worst."""
    states: dict[str, str] = {}
    for breaker in list(_breakers):
        state = breaker.state
        if _STATE_VALUES[state] >= _STATE_VALUES.get(states.get(breaker.name, _CLOSED), 0):
            states[breaker.name] = state
    return dict(sorted(states.items()))


class CircuitOpen(TransientError):
    """The circuit ``name`` is open: the dependency is not called until ``retry_after_s`` passes."""

    def __init__(self, name: str, retry_after_s: float) -> None:
        super().__init__(f"circuit {name!r} is open; retry after {retry_after_s:.2f}s")
        self.name = name
        self.retry_after_s = retry_after_s


class CircuitBreaker:
    """Closed → open after ``failure_threshold`` consecutive failures; open for
    ``reset_timeout_s``; then half-open, where ``half_open_max_calls`` trial calls (or the
    ``probe``, when given) decide: a success closes it, a failure opens it again.

    Use ``breaker.call(fn, *args)``, ``@breaker`` or ``with breaker:`` (these raise
    ``CircuitOpen``), or ``allow()`` followed by ``record_success()``/``record_failure()`` where
    an exception is not wanted. Only exceptions that are instances of ``failure_types`` count as
    failures; any other outcome means the dependency answered, which counts as a success.
    An outcome reported while the circuit is open (of a call let through before it opened) is
    ignored. Raises ValueError for a threshold or trial count below 1, or a timeout that is not a
    number of seconds above 0 and at most a week.
    """

    CLOSED, HALF_OPEN, OPEN = _CLOSED, _HALF_OPEN, _OPEN

    def __init__(self, name: str, *, failure_threshold: int, reset_timeout_s: float,
                 half_open_max_calls: int = 1, failure_types: tuple[type[BaseException], ...] = (Exception,),
                 clock: Callable[[], float] = time.monotonic, probe: Callable[[], object] | None = None,
                 after_close: Callable[[], object] | None = None) -> None:
        if failure_threshold < 1 or half_open_max_calls < 1:
            raise ValueError("failure_threshold and half_open_max_calls must be at least 1")
        self.name = name
        self.failure_threshold = failure_threshold
        # nan and inf would never half-open it.
        self.reset_timeout_s = checked_seconds("reset_timeout_s", reset_timeout_s, at_most=MAX_RESET_TIMEOUT_S)
        self.half_open_max_calls = half_open_max_calls
        self.failure_types = failure_types
        self._clock = clock
        # A probe, not a caller's trial call, ends an outage: it can do recovery work first (the
        # cache replays deferred invalidations), where a trial call could return a value that
        # recovery was about to invalidate.
        self._probe = probe
        # Run on the probe's thread once its success closed the circuit (errors logged): for
        # what callers refused while the probe ran left behind (see composition.cache).
        self._after_close = after_close
        self._lock = threading.Lock()
        self._state = _CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trials = 0
        self._probing = False
        self._state_gauge = CIRCUIT_STATE.labels(name)
        self._rejections = CIRCUIT_REJECTIONS_TOTAL.labels(name)
        self._state_gauge.set(0)
        _breakers.add(self)

    @property
    def state(self) -> str:
        """``"closed"``, ``"half_open"`` or ``"open"``."""
        with self._lock:
            self._advance()
            return self._state

    @property
    def is_open(self) -> bool:
        """True unless the circuit is closed (open, or half-open while its trial runs)."""
        return self._state != _CLOSED

    def allow(self) -> bool:
        """True when a call may go through now (half-open, it then counts as a trial); False when
        the circuit refuses it. Report the call's outcome with record_success/record_failure."""
        if self._state == _CLOSED:  # no lock: this is on every cache hit
            return True
        return self._refusal() is None

    def before_call(self) -> None:
        """Raise CircuitOpen when the call must not go through; otherwise count it."""
        if self._state == _CLOSED:
            return
        retry_after_s = self._refusal()
        if retry_after_s is not None:
            raise CircuitOpen(self.name, retry_after_s)

    def record_success(self) -> None:
        """The dependency answered: reset the failure count; a trial call's success closes it."""
        if self._state == _CLOSED and not self._failures:
            return  # nothing to reset (read without the lock: on every cache hit)
        with self._lock:
            if self._late():
                return
            self._failures = 0
            self._set(_CLOSED)

    def record_failure(self) -> None:
        """The dependency failed: open after ``failure_threshold`` in a row, or at once half-open."""
        with self._lock:
            if self._late():
                return
            self._failures += 1
            if self._state == _HALF_OPEN or self._failures >= self.failure_threshold:
                self._opened_at = self._clock()
                self._set(_OPEN)

    def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)`` through the breaker; raises CircuitOpen or what ``fn`` raises."""
        self.before_call()
        try:
            result = fn(*args, **kwargs)
        except self.failure_types:
            self.record_failure()
            raise
        except BaseException:
            self.record_success()
            raise
        self.record_success()
        return result

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            return self.call(fn, *args, **kwargs)

        guarded.__name__ = getattr(fn, "__name__", "guarded")
        guarded.__doc__ = fn.__doc__
        return guarded

    def __enter__(self) -> CircuitBreaker:
        self.before_call()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is not None and isinstance(exc, self.failure_types):
            self.record_failure()
        else:
            self.record_success()

    # -- internals (under self._lock unless said otherwise) ------------------------------------

    def _set(self, state: str) -> None:
        if state != self._state:
            log.warning("circuit state changed", circuit=self.name, old=self._state, new=state)
        self._state = state
        self._state_gauge.set(_STATE_VALUES[state])

    def _late(self) -> bool:
        """Whether an outcome reported now is of a call let through before the circuit opened:
        open, the circuit lets no call through, and with a probe only the probe decides. Such an
        outcome must neither close it (a slow call that still answered is no trial) nor restart
        its reset timeout."""
        return self._state == _OPEN or (self._probe is not None and self._state != _CLOSED)

    def _advance(self) -> None:
        # With a probe, only the probe leaves the open state (see _refusal).
        if self._probe is None and self._state == _OPEN \
                and self._clock() - self._opened_at >= self.reset_timeout_s:
            self._set(_HALF_OPEN)
            self._trials = 0

    def _refusal(self) -> float | None:
        """None when a call may go through (counted as a trial when half-open); otherwise the
        seconds until it may, with the refusal counted. Takes the lock."""
        start_probe = False
        with self._lock:
            self._advance()
            if self._state == _CLOSED:
                return None
            if self._state == _OPEN:
                retry_after_s = self.reset_timeout_s - (self._clock() - self._opened_at)
                if self._probe is not None and retry_after_s <= 0 and not self._probing:
                    self._probing = start_probe = True
                    self._set(_HALF_OPEN)
                    retry_after_s = self.reset_timeout_s
            elif self._probe is None and self._trials < self.half_open_max_calls:
                self._trials += 1
                return None
            else:
                retry_after_s = self.reset_timeout_s
        if start_probe:
            threading.Thread(target=self._run_probe, name=f"breaker-probe-{self.name}", daemon=True).start()
        self._rejections.inc()
        return max(0.0, retry_after_s)

    def _run_probe(self) -> None:
        """The probe thread (no lock held while the probe runs)."""
        assert self._probe is not None
        succeeded = False
        try:
            self._probe()
            succeeded = True
        except Exception as exc:
            log.info("circuit probe failed", circuit=self.name, error=str(exc))
        finally:
            with self._lock:
                self._probing = False
                if succeeded:
                    self._failures = 0
                    self._set(_CLOSED)
                else:
                    self._opened_at = self._clock()
                    self._set(_OPEN)
        if succeeded and self._after_close is not None:
            try:
                self._after_close()
            except Exception as exc:
                log.warning("circuit after-close step failed", circuit=self.name, error=str(exc))
