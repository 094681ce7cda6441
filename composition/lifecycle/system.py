"""Explicit lifecycle: components start in dependency order and stop in reverse.

A ``System`` starts its components one by one; if one fails, those started are drained and
stopped as in any stop, and one ``SystemStartError`` names it. ``stop()`` runs in reverse, bounds
each component by a timeout, carries on past failures and returns a report. ``run()`` adds
signals: the first SIGTERM or SIGINT drains, then stops; a second SIGINT (Ctrl-C again) exits at
once, while another SIGTERM is the same stop request seen again (``signals``).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType

import structlog

from composition.errors import SystemStartError, described
from composition.lifecycle.base import Component
from composition.lifecycle.ordering import order_components
from composition.lifecycle.ready_file import ReadyFile
from composition.lifecycle.signals import another_signal, install_stop_signals, restore_signals
from composition.lifecycle.stopping import StopResult, call_with_timeout, stop_with_timeout
from composition.metrics import COMPONENT_START_SECONDS, COMPONENT_STOP_SECONDS

__all__ = ["MIN_STOP_SLICE_S", "OVERRUN_S", "System"]

# The logger name predates the package; operators' log filters (and the tests) select on it.
log = structlog.get_logger("composition.system")

# How far past the deadline the stops of the components left may run, all of them together: a
# component stuck in a call to a dependency that hangs (a blackholed database) is abandoned, and
# the rest still close their connections and flush their logs, each given at least
# MIN_STOP_SLICE_S (as is a drain hook reached past the deadline). One stuck component after
# another each took a whole second, so a stop with the database away overran an 8 s timeout by
# 5 s, into the container's SIGKILL.
OVERRUN_S = 2.0
MIN_STOP_SLICE_S = 0.1
# How often the main thread looks for a stop request (and a component that died) while it runs.
STOP_POLL_S = 0.2


@dataclass
class System:
    """An ordered set of components with one start, one stop and one signal policy.

    ``components`` are given in a sensible order; ``depends_on`` on a component moves it after
    its dependencies (a stable topological sort: ties keep the given order).
    ``shutdown_timeout_s`` bounds the whole drain-and-stop; ``stop_timeout_s`` bounds each
    component's stop unless the component has its own ``stop_timeout_s``. ``ready_file``, when
    given, is written (the pid) by ``run`` once every component has started, and removed at the
    first signal, at a forced exit and at exit (only a SIGKILL leaves it).
    """

    components: Sequence[Component]
    shutdown_timeout_s: float = 30.0
    stop_timeout_s: float = 10.0
    on_draining: Callable[[], None] | None = None
    ready_file: Path | None = None
    started: list[Component] = field(default_factory=list, init=False)
    _ready: ReadyFile | None = field(default=None, init=False)
    _stop_event: threading.Event = field(default_factory=threading.Event, init=False)
    # The first signal's number, set by the handler and read by the main thread: a plain attribute,
    # not the event (see _on_signal).
    _signal_received: int | None = field(default=None, init=False)
    _signal_logged: bool = field(default=False, init=False)
    _stopping: bool = field(default=False, init=False)
    _started_once: bool = field(default=False, init=False)
    _starting: Component | None = field(default=None, init=False)
    # The one being stopped (out of ``started`` already): a second Ctrl-C kills it too.
    _in_stop: Component | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.components = order_components(self.components)
        self._ready = None if self.ready_file is None else ReadyFile(self.ready_file)

    # -- introspection -------------------------------------------------------------------
    @property
    def start_order(self) -> list[str]:
        return [c.name for c in self.components]

    def graph(self) -> dict[str, list[str]]:
        """Each component's name with the names it depends on."""
        return {c.name: list(getattr(c, "depends_on", ())) for c in self.components}

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Start every component in order; on a failure drain and stop what started (as
        ``stop()`` does) and raise SystemStartError.

        A stop requested meanwhile (a signal under ``run``, ``request_stop()``) ends the start-up
        early: the rest is not started, a component waiting to be ready gives up
        (``cancel_start``), and what did start is then drained and stopped as in any stop,
        rather than after every other component came up. A System starts once: started again
        after its stop it raised nothing, started everything, and its next stop stopped nothing.
        """
        if self._started_once:
            raise RuntimeError("this System was started already: build a new one to start again")
        self._started_once = True
        for component in self.components:
            # Named before the check: a signal after the check cancels this start (cancel_start),
            # one before it is seen by the check. The other way round, a signal in between was
            # seen only once the start had waited out its whole ready timeout.
            self._starting = component
            if self._stop_requested():
                self._starting = None
                self._log_signal()
                log.info("stop requested during start-up; the rest is not started", next=component.name)
                return
            began = time.monotonic()
            try:
                component.start()
            except BaseException as exc:
                if self._stop_requested() and isinstance(exc, Exception) \
                        and getattr(component, "cancel_start", None) is not None:
                    # Told to give up (cancel_start): that is the stop, not a failure. Any other
                    # component failed on its own, stop or no stop, and is reported as failed.
                    self._log_signal()
                    log.info("start-up cancelled by a stop request", component=component.name,
                             error=described(exc))
                    return
                log.error("component failed to start", component=component.name,
                          error=described(exc))
                # Drained as in any stop, not only stopped: a child process started already may
                # be running jobs, which it finishes within the shutdown timeout.
                rollback = self.stop()
                raise SystemStartError(component.name, exc, rollback) from exc
            finally:
                self._starting = None
            self.started.append(component)
            took = time.monotonic() - began
            COMPONENT_START_SECONDS.labels(component.name).observe(took)
            log.info("component started", component=component.name, duration_s=round(took, 4))

    def drain(self, deadline: float) -> list[StopResult]:
        """Stop intake and let in-flight work finish, newest component first, until deadline.

        Each hook runs bounded by the deadline (a hung one is abandoned); returns the hooks that
        failed or overran, named ``"<component> (drain)"``, so a dirty drain is never reported
        as clean. The stops that follow run whatever happened here.
        """
        self._remove_ready_file()  # no longer up: a probe of it sees so at once
        if self.on_draining is not None:
            self.on_draining()
        problems: list[StopResult] = []
        for hook in ("begin_drain", "drain"):
            for component in reversed(self.started):
                method = getattr(component, hook, None)
                if method is None:
                    continue
                budget = max(MIN_STOP_SLICE_S, deadline - time.monotonic())
                call = (lambda m=method: m(deadline)) if hook == "drain" else method
                result = call_with_timeout(f"{component.name} (drain)", call, budget)
                if result.status != "stopped":
                    log.error("component did not drain cleanly", component=component.name,
                              status=result.status, error=result.error)
                    problems.append(result)
        return problems

    def stop(self, *, drain: bool = True) -> list[StopResult]:
        """Drain (optional), then stop every started component in reverse; return the report:
        the drain hooks that failed or overran, then one entry per stopped component."""
        if self._stopping:
            return []
        self._stopping = True
        deadline = time.monotonic() + self.shutdown_timeout_s
        problems = self.drain(deadline) if drain else []
        return problems + self._stop_started(deadline)

    def _stop_started(self, deadline: float) -> list[StopResult]:
        report = []
        overrun_deadline = deadline + OVERRUN_S
        while self.started:
            component = self._in_stop = self.started[-1]
            self.started.pop()
            own = getattr(component, "stop_timeout_s", None) or self.stop_timeout_s
            budget = max(MIN_STOP_SLICE_S, min(own, overrun_deadline - time.monotonic()))
            result = stop_with_timeout(component, budget)
            self._in_stop = None
            report.append(result)
            COMPONENT_STOP_SECONDS.labels(component.name, result.status).observe(result.duration_s)
            fields = {"component": component.name, "status": result.status,
                      "duration_s": round(result.duration_s, 4)}
            if result.status == "stopped":
                log.info("component stopped", **fields)
            else:
                log.error("component did not stop cleanly", error=result.error, **fields)
        return report

    # -- running under signals ---------------------------------------------------------------
    def run(self, *, install_signals: bool = True,
            on_started: Callable[[], None] | None = None) -> list[StopResult]:
        """Start, wait for a signal (or ``request_stop()``), then drain and stop.

        Once every component has started, the ``ready_file`` is written and ``on_started`` called
        (not after a start a stop cut short); either failing stops the system, reported as a
        failed "start announcement". Must be called from the main thread when
        ``install_signals`` is true.
        """
        previous = install_stop_signals(self._on_signal) if install_signals else {}
        not_announced: StopResult | None = None
        try:
            self.start()
            if (on_started is not None or self.ready_file is not None) \
                    and len(self.started) == len(self.components) and not self._stop_requested():
                began = time.monotonic()
                try:
                    if self._ready is not None:
                        self._ready.write()
                    if on_started is not None:
                        on_started()
                except Exception as exc:
                    # Everything runs (the worker threads too): stop it as any stop does, rather
                    # than leave it to the interpreter's exit with jobs under way; and say so in
                    # the report, whose clean stop read as a deliberate exit 0 (no restart).
                    log.error("could not announce the start; stopping", error=described(exc))
                    not_announced = StopResult("start announcement", "failed", time.monotonic() - began,
                                               described(exc))
                    self._stop_event.set()
            failed = None
            # Slept, not the event's wait: a signal's handler must find no lock of the event held.
            while not self._stop_requested():
                time.sleep(STOP_POLL_S)
                failed = self._first_failed()
                if failed is not None:
                    log.error("component died, stopping the system", component=failed)
                    break
            self._log_signal()
            report = self.stop()
            # A component that ended on its own did not stop cleanly, whatever its exit code: the
            # system's exit says so, so that a supervisor (systemd's Restart=on-failure, a
            # container's restart policy) starts it again.
            return [*([not_announced] if not_announced else []),
                    *(replace(result, status="died", error=result.error or "ended on its own while the system ran")
                      if result.name == failed else result for result in report)]
        finally:
            self._remove_ready_file()
            restore_signals(previous)

    def request_stop(self) -> None:
        """Ask ``run()`` to drain and stop (from another thread; not from a signal handler)."""
        self._stop_event.set()

    def _stop_requested(self) -> bool:
        return self._signal_received is not None or self._stop_event.is_set()

    def _log_signal(self) -> None:
        """The first signal's line, said by the main thread once it sees the signal (the
        handler says nothing: see _on_signal)."""
        if self._signal_received is not None and not self._signal_logged:
            self._signal_logged = True
            log.info("signal received, draining", signal=signal.Signals(self._signal_received).name)

    def _remove_ready_file(self) -> None:
        """Remove the ready file, if any: from the signal handler too (one ``unlink``, no lock)."""
        if self._ready is not None:
            self._ready.remove()

    def _first_failed(self) -> str | None:
        for component in self.started:
            alive = getattr(component, "alive", None)
            if alive is not None and not alive():
                return component.name
        return None

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """The handler ``run`` installs. It takes no lock (``composition.lifecycle.signals``): it
        sets plain attributes (this one, a component's ``cancel_start`` flag) and unlinks the
        ready file."""
        if self._signal_received is not None:
            another_signal(signum, [*self.started, self._starting, self._in_stop], self._ready)
            return
        self._signal_received = signum
        self._remove_ready_file()  # at the signal itself, not at the main thread's next poll
        starting = self._starting
        cancel = getattr(starting, "cancel_start", None)
        if cancel is not None:  # a component waiting to be ready (a child process) gives up now
            cancel()
