"""Child processes as components: own session, die with the parent, drain on SIGTERM; ready
when a URL answers or a file appears (``AwaitReady`` waits for several files at once)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from composition.errors import described

__all__ = ["AwaitReady", "ProcessComponent", "detach_and_die_with_parent", "die_with_parent"]

log = structlog.get_logger("composition.processes")

_PR_SET_PDEATHSIG = 1
# Of a child's stop budget, the part kept for SIGKILL and reaping after SIGTERM was ignored.
KILL_RESERVE_S = 1.0


def _load_prctl() -> Callable[..., int] | None:
    try:
        prctl: Callable[..., int] = ctypes.CDLL("libc.so.6", use_errno=True).prctl
        return prctl
    except OSError:  # not Linux: the child's own parent watch has to do
        return None


# Loaded once, in the parent: between fork and exec the child should do as little as it can.
_PRCTL = _load_prctl()


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """In a child, before exec: ``sig`` when the parent dies. A parent that died already, between
    the fork and here, would never send it: then the child ends at once (it was left behind as
    an orphan that went on taking jobs)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent_pid:
        os._exit(1)


def detach_and_die_with_parent(parent_pid: int | None = None) -> None:
    """In the child, before exec: own session (a terminal's Ctrl-C reaches only the parent, which
    then drains in order) and SIGTERM when the parent dies (``parent_pid``: the parent's pid,
    taken before the fork; ``ProcessComponent`` passes it)."""
    os.setsid()
    die_with_parent(os.getppid() if parent_pid is None else parent_pid)


class ProcessComponent:
    """A child process in its own session. Start waits until ``ready_url`` answers 200 (when
    given); with a ``ready_file`` (which the child writes once it is up, as a ``System`` given a
    ``ready_file`` does: ``runworkers --ready-file``) start only launches it, and an
    ``AwaitReady`` after it waits for the file. Drain runs ``pre_stop`` (when given: a web
    server's draining window, while it still serves), then sends SIGTERM and waits until the
    deadline; stop kills what is left, then calls ``on_exit(pid)`` once the child was reaped (a
    supervisor archives its metrics files)."""

    def __init__(self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None,
                 depends_on: Sequence[str] = (), ready_url: str | None = None, ready_file: Path | None = None,
                 start_timeout_s: float = 60.0, cwd: str | None = None,
                 pre_stop: Callable[[], None] | None = None,
                 on_exit: Callable[[int], None] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.depends_on = tuple(depends_on)
        self.ready_url = ready_url
        self.ready_file = ready_file
        self.start_timeout_s = start_timeout_s
        self.cwd = cwd
        self.pre_stop = pre_stop
        self.on_exit = on_exit
        self.process: subprocess.Popen[bytes] | None = None
        self.launched_at = 0.0
        self._start_cancelled = False

    def cancel_start(self) -> None:
        """Give up waiting for readiness (a stop came during start-up): start raises. Called from
        a signal handler, so it only sets a flag, which the waits poll: an event's ``set`` there
        could wait for ever on a lock the interrupted ``wait`` holds."""
        self._start_cancelled = True

    def start(self) -> None:
        if self.ready_file is not None:
            self.ready_file.unlink(missing_ok=True)  # an earlier life's
        self.launched_at = time.monotonic()
        self.process = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd,
                                        preexec_fn=functools.partial(detach_and_die_with_parent, os.getpid()))
        if self.ready_url:
            # Not started until it answers: a start that fails kills what it launched.
            self._wait_ready(self.ready_url, self._url_answers)

    def ready_now(self) -> bool:
        """Whether the child has written its ``ready_file`` (True without one); raises
        RuntimeError when the child exited first or a stop cancelled the start, TimeoutError
        ``start_timeout_s`` after its launch. The child is left running either way: started, it
        is drained and stopped with the rest (a worker already running jobs finishes them)."""
        assert self.process is not None
        if self.ready_file is None:
            return True
        if self._start_cancelled:
            raise RuntimeError("start cancelled: a stop was requested before it was ready")
        if self.process.poll() is not None:
            raise RuntimeError(f"exited with code {self.process.returncode} before it was ready")
        if self.ready_file.exists():
            return True
        if time.monotonic() > self.launched_at + self.start_timeout_s:
            raise TimeoutError(f"{self.ready_file} not written within {self.start_timeout_s:.0f}s")
        return False

    def _url_answers(self) -> tuple[str, bool]:
        assert self.ready_url is not None
        try:
            with urllib.request.urlopen(self.ready_url, timeout=2) as response:
                return f"HTTP {response.status}", response.status == 200
        except Exception as exc:
            return str(exc), False

    def _wait_ready(self, what: str, ready: Callable[[], tuple[str, bool]]) -> None:
        assert self.process is not None
        deadline = self.launched_at + self.start_timeout_s
        last_error = "no answer"
        while time.monotonic() < deadline:
            if self._start_cancelled:
                self._kill()
                raise RuntimeError("start cancelled: a stop was requested before it was ready")
            if self.process.poll() is not None:
                raise RuntimeError(f"exited with code {self.process.returncode} before it was ready")
            error, done = ready()
            if done:
                return
            last_error = error or last_error
            time.sleep(0.2)
        self._kill()
        raise TimeoutError(f"{what} not ready within {self.start_timeout_s:.0f}s: {last_error}")

    def kill_now(self) -> None:
        """SIGKILL the child's process group without waiting: a second Ctrl-C's way (``System``)."""
        if self.alive():
            self._signal(signal.SIGKILL)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def begin_drain(self) -> None:
        if self.alive() and self.pre_stop is not None:
            try:
                self.pre_stop()
            except Exception as exc:  # the stop goes on: a failed pre-stop only loses the window
                log.error("pre-stop step failed", component=self.name, error=described(exc))
        if self.alive():
            self._signal(signal.SIGTERM)

    def drain(self, deadline: float) -> None:
        if not self.alive():
            return
        assert self.process is not None
        try:
            self.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("child did not drain before the deadline", component=self.name)

    def stop(self, timeout_s: float) -> None:
        if self.process is None:
            return
        if self.alive():
            self._signal(signal.SIGTERM)
            # The kill comes inside the budget, not after it: the supervisor gives up on a stop
            # at its budget and may exit, leaving a child that ignores SIGTERM (a gunicorn
            # already stopping does) running on its own.
            grace_s = max(0.0, timeout_s - min(KILL_RESERVE_S, timeout_s / 2))
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                log.warning("child ignored SIGTERM until its stop budget ran out; killing it", component=self.name)
                self._kill()
        code = self.process.returncode
        if code is not None and self.on_exit is not None:
            try:
                self.on_exit(self.process.pid)
            except Exception as exc:  # the stop goes on: a failed hook must not hide the exit code
                log.error("exit hook failed", component=self.name, error=described(exc))
        if code not in (0, None, -signal.SIGTERM):
            raise RuntimeError(f"exited with code {code}")

    def _signal(self, signum: int) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)

    def _kill(self) -> None:
        if self.alive():
            self._signal(signal.SIGKILL)
            assert self.process is not None
            self.process.wait()


class AwaitReady:
    """Ready once every one of ``processes`` is (``ProcessComponent.ready_now``): placed after
    them, their start-ups run side by side, and the first that exits or times out fails the
    start."""

    def __init__(self, name: str, processes: Sequence[ProcessComponent]) -> None:
        self.name = name
        self.processes = list(processes)
        self.depends_on = tuple(process.name for process in self.processes)

    def cancel_start(self) -> None:
        for process in self.processes:
            process.cancel_start()

    def start(self) -> None:
        waiting = list(self.processes)
        while waiting:
            for process in list(waiting):
                try:
                    if process.ready_now():
                        waiting.remove(process)
                except Exception as exc:
                    raise RuntimeError(f"{process.name}: {exc}") from exc
            if waiting:
                time.sleep(0.1)

    def drain(self, deadline: float) -> None:
        pass

    def stop(self, timeout_s: float) -> None:
        pass
