"""The composed lifecycle: start order, rollback, reverse stop, timeouts, signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from composition.errors import ComponentError, SystemStartError
from composition.lifecycle import PeriodicComponent, ProcessComponent, System
from composition.lifecycle.processes import AwaitReady
from composition.lifecycle.system import MIN_STOP_SLICE_S, OVERRUN_S
from composition.testing import wait_until
from tests.helpers import ROOT


class Recorder:
    """A component that records what happens to it in a shared journal."""

    def __init__(self, name: str, journal: list[str], *, fail_start: bool = False, fail_stop: bool = False,
                 hang_stop_s: float = 0.0, depends_on: tuple[str, ...] = ()) -> None:
        self.name = name
        self.journal = journal
        self.fail_start = fail_start
        self.fail_stop = fail_stop
        self.hang_stop_s = hang_stop_s
        self.depends_on = depends_on

    def start(self) -> None:
        if self.fail_start:
            self.journal.append(f"start-failed:{self.name}")
            raise ConnectionError("database refused the connection")
        self.journal.append(f"start:{self.name}")

    def stop(self, timeout_s: float) -> None:
        self.journal.append(f"stop:{self.name}")
        if self.hang_stop_s:
            time.sleep(self.hang_stop_s)
        if self.fail_stop:
            raise RuntimeError("flush failed")


def test_starts_in_declared_order_and_stops_in_reverse() -> None:
    journal: list[str] = []
    system = System([Recorder(n, journal) for n in ("logger", "metrics", "db", "cache", "http")])
    system.start()
    report = system.stop()
    assert journal == ["start:logger", "start:metrics", "start:db", "start:cache", "start:http",
                       "stop:http", "stop:cache", "stop:db", "stop:metrics", "stop:logger"]
    assert [r.name for r in report] == ["http", "cache", "db", "metrics", "logger"]
    assert all(r.status == "stopped" for r in report)
    # Once: started again it started everything and its next stop stopped nothing.
    with pytest.raises(RuntimeError, match="started already: build a new one"):
        system.start()
    assert system.started == []


def test_depends_on_moves_a_component_after_its_dependencies() -> None:
    journal: list[str] = []
    workers = Recorder("workers", journal, depends_on=("db", "queue"))
    system = System([workers, Recorder("db", journal), Recorder("queue", journal, depends_on=("db",))])
    assert system.start_order == ["db", "queue", "workers"]
    assert system.graph() == {"db": [], "queue": ["db"], "workers": ["db", "queue"]}


def test_dependency_cycle_and_unknown_dependency_are_refused() -> None:
    journal: list[str] = []
    with pytest.raises(ComponentError, match="cycle"):
        System([Recorder("a", journal, depends_on=("b",)), Recorder("b", journal, depends_on=("a",))])
    with pytest.raises(ComponentError, match="unknown component 'nope'"):
        System([Recorder("a", journal, depends_on=("nope",))])
    with pytest.raises(ComponentError, match="share this name"):
        System([Recorder("a", journal), Recorder("a", journal)])


def test_failed_start_rolls_back_in_reverse_and_later_components_never_start() -> None:
    journal: list[str] = []
    system = System([Recorder("logger", journal), Recorder("metrics", journal),
                     Recorder("db", journal, fail_start=True), Recorder("workers", journal),
                     Recorder("http", journal)])
    with pytest.raises(SystemStartError) as caught:
        system.start()
    assert journal == ["start:logger", "start:metrics", "start-failed:db", "stop:metrics", "stop:logger"]
    error = caught.value
    assert error.component == "db"
    assert "db" in str(error) and "database refused the connection" in str(error)
    assert isinstance(error.cause, ConnectionError)
    assert [r.name for r in error.rollback] == ["metrics", "logger"]
    assert system.started == []


def test_stop_continues_past_a_failing_component_and_reports_it() -> None:
    journal: list[str] = []
    system = System([Recorder("db", journal), Recorder("metrics", journal, fail_stop=True),
                     Recorder("http", journal)])
    system.start()
    report = system.stop()
    assert journal[-3:] == ["stop:http", "stop:metrics", "stop:db"]
    statuses = {r.name: r.status for r in report}
    assert statuses == {"http": "stopped", "metrics": "failed", "db": "stopped"}
    failed = next(r for r in report if r.name == "metrics")
    assert failed.error is not None and "flush failed" in failed.error


def test_a_hanging_stop_is_cut_at_its_timeout() -> None:
    journal: list[str] = []
    hanging = Recorder("queue", journal, hang_stop_s=30)
    system = System([Recorder("db", journal), hanging, Recorder("http", journal)], stop_timeout_s=0.3)
    system.start()
    began = time.monotonic()
    report = system.stop()
    took = time.monotonic() - began
    statuses = {r.name: r.status for r in report}
    assert statuses == {"http": "stopped", "queue": "timeout", "db": "stopped"}
    # The hang was cut; the component after it still stopped.
    assert took < 5
    assert journal[-1] == "stop:db"


def test_stops_past_the_deadline_share_one_short_overrun_however_many_hang() -> None:
    # Each stuck component (a periodic thread in a call to a blackholed database) took a whole
    # second after the deadline, one after another: 8 s of shutdown timeout became 13.
    journal: list[str] = []
    components = [Recorder("db", journal), Recorder("logs", journal),
                  *(Recorder(f"stuck-{index}", journal, hang_stop_s=30) for index in range(6))]

    class SlowDrain(Recorder):
        def drain(self, deadline: float) -> None:
            time.sleep(max(0.0, deadline - time.monotonic()))  # the drain uses up the deadline

    system = System([*components, SlowDrain("workers", journal)], shutdown_timeout_s=1.0)
    system.start()
    began = time.monotonic()
    report = system.stop()
    took = time.monotonic() - began
    assert took < 1.0 + OVERRUN_S + 8 * MIN_STOP_SLICE_S + 1.0, took
    # Those after the stuck ones were still stopped, in order.
    assert journal[-2:] == ["stop:logs", "stop:db"]
    assert {r.name: r.status for r in report}["db"] == "stopped"


def test_nothing_is_announced_when_a_stop_cuts_the_start_short_and_a_failed_start_is_not_a_cancel() -> None:
    journal: list[str] = []
    system = System([Recorder("db", journal), Recorder("http", journal)])
    system.request_stop()
    announced: list[bool] = []
    system.run(install_signals=False, on_started=lambda: announced.append(True))
    assert announced == [], "announced as up after a start the stop cut short"

    # A component that fails on its own while a stop is requested failed: it was not cancelled.
    class FailsWhileStopping(Recorder):
        def start(self) -> None:
            system.request_stop()
            raise ConnectionError("database refused the connection")

    system = System([Recorder("db", journal), FailsWhileStopping("http", journal)])
    with pytest.raises(SystemStartError, match="http"):
        system.start()
    # Once, a failed start too (its rollback emptied what had started).
    with pytest.raises(RuntimeError, match="started already"):
        system.start()


def test_a_start_that_could_not_be_announced_stops_and_is_reported_failed() -> None:
    """--ready-file on a full disk: the system stopped cleanly and runworkers exited 0, which
    systemd's and Docker's on-failure restarts take for a deliberate stop."""
    journal: list[str] = []

    def announce() -> None:
        raise OSError(28, "No space left on device")

    report = System([Recorder("db", journal), Recorder("http", journal)]).run(install_signals=False,
                                                                            on_started=announce)
    assert journal == ["start:db", "start:http", "stop:http", "stop:db"]
    assert [(result.name, result.status) for result in report] == [
        ("start announcement", "failed"), ("http", "stopped"), ("db", "stopped")]
    assert "No space left on device" in (report[0].error or "")


def test_drain_runs_before_any_stop_and_readiness_hook_fires_first() -> None:
    journal: list[str] = []

    class Intake(Recorder):
        def begin_drain(self) -> None:
            self.journal.append(f"begin_drain:{self.name}")

        def drain(self, deadline: float) -> None:
            self.journal.append(f"drain:{self.name}")

    system = System([Recorder("db", journal), Intake("workers", journal), Intake("http", journal)],
                    on_draining=lambda: journal.append("not-ready"))
    system.start()
    system.stop()
    assert journal[3:] == ["not-ready", "begin_drain:http", "begin_drain:workers", "drain:http",
                           "drain:workers", "stop:http", "stop:workers", "stop:db"]


def test_run_stops_when_request_stop_is_called_from_another_thread() -> None:
    journal: list[str] = []
    system = System([Recorder("db", journal), Recorder("http", journal)])
    threading.Timer(0.2, system.request_stop).start()
    report = system.run(install_signals=False)
    assert [r.name for r in report] == ["http", "db"]


SIGNAL_SCRIPT = textwrap.dedent("""
    import sys, time
    from composition.lifecycle import System

    class Slow:
        def __init__(self, name, drain_s):
            self.name, self.drain_s = name, drain_s
        def start(self):
            print("started", self.name, flush=True)
        def drain(self, deadline):
            time.sleep(self.drain_s)
        def stop(self, timeout_s):
            print("stopped", self.name, flush=True)

    system = System([Slow("db", 0), Slow("workers", float(sys.argv[1]))], shutdown_timeout_s=30,
                    on_draining=lambda: print("draining", flush=True))
    report = system.run(on_started=lambda: print("ready", flush=True))
    sys.exit(0 if all(r.status == "stopped" for r in report) else 1)
""")


def _spawn(drain_s: float) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", SIGNAL_SCRIPT, str(drain_s)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == "ready":
            break
    return process


def test_sigterm_drains_then_stops_in_reverse_and_exits_zero() -> None:
    process = _spawn(drain_s=0.2)
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=20)
    assert process.returncode == 0
    stops = [line for line in out.splitlines() if line.startswith("stopped")]
    assert stops == ["stopped workers", "stopped db"]


def test_second_signal_exits_at_once() -> None:
    process = _spawn(drain_s=60)
    process.send_signal(signal.SIGINT)
    time.sleep(0.3)  # an operator's second Ctrl-C, however soon
    began = time.monotonic()
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=10)
    assert time.monotonic() - began < 5
    assert process.returncode == 130
    assert not [line for line in out.splitlines() if line.startswith("stopped")]


def _draining(process: subprocess.Popen[str]) -> None:
    """Until ``process`` has taken the first signal: two SIGTERMs pending at once are one (POSIX
    does not queue them), as a loaded machine showed by not running the child in between."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == "draining":
            return


def test_the_same_stop_request_seen_twice_still_drains() -> None:
    # systemd's KillMode=control-group signals every process of the service at once: a child of
    # runworkers gets SIGTERM from systemd and from its supervisor, a moment apart. Taken as an
    # operator's second signal, it exited at once and dropped the jobs it was finishing.
    process = _spawn(drain_s=0.5)
    process.send_signal(signal.SIGTERM)
    _draining(process)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert "the same stop request" in err
    assert [line for line in out.splitlines() if line.startswith("stopped")] == ["stopped workers", "stopped db"]
    # Seconds later too: ./run's supervisor signals its workers child once the web's draining
    # window (a pre-stop of several seconds) has ended, after systemd did. Taken then as the
    # operator's second signal, the child exited at once mid-job.
    process = _spawn(drain_s=2.5)
    process.send_signal(signal.SIGTERM)
    time.sleep(1.5)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert [line for line in out.splitlines() if line.startswith("stopped")] == ["stopped workers", "stopped db"]
    # The operator's way to insist is Ctrl-C (SIGINT), after either signal.
    process = _spawn(drain_s=60)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=10)
    assert process.returncode == 130


# SIGTERM at the n-th line the main thread runs (of the lifecycle's code and of threading's),
# for every n over a round of its wait: in the run's wait for a stop, then in a child's start-up
# wait (ProcessComponent's ready wait, which cancel_start ends). Python runs a handler between
# two bytecodes of the main thread: one that took a lock held there (Event.set while
# Event.wait held the event's lock) deadlocked the process, and a runworkers on CI logged
# "signal received, draining", then nothing, until it was killed 30 s later.
SIGNAL_AT_EVERY_LINE = textwrap.dedent("""
    import faulthandler, signal, socket, sys, threading
    import composition.lifecycle.processes, composition.lifecycle.system
    from composition.lifecycle import ProcessComponent, System

    class Idle:
        name = "idle"
        def start(self): pass
        def stop(self, timeout_s): pass

    def closed_port():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    def run_signalled_at(line, system, armed, files):
        seen = 0
        def tracer(frame, event, arg):
            nonlocal seen
            if event == "line" and armed and frame.f_code.co_filename in files:
                seen += 1
                if seen == line:
                    signal.raise_signal(signal.SIGTERM)
            return tracer
        faulthandler.dump_traceback_later(15, exit=True)  # a deadlock: say where, and end
        sys.settrace(tracer)
        try:
            return system.run(on_started=lambda: armed.append(True))
        finally:
            sys.settrace(None)
            faulthandler.cancel_dump_traceback_later()

    lifecycle = {threading.__file__, composition.lifecycle.system.__file__,
                 composition.lifecycle.processes.__file__}
    for line in range(1, 13):
        report = run_signalled_at(line, System([Idle()]), [], lifecycle)
        print("waiting", line, [result.status for result in report], flush=True)
    for line in range(1, 13):
        child = ProcessComponent("child", ["sleep", "60"], ready_url=f"http://127.0.0.1:{closed_port()}/",
                                 start_timeout_s=30)
        # Only lines of the child's start (the handlers are in place by then).
        report = run_signalled_at(line, System([child]), [True], lifecycle - {composition.lifecycle.system.__file__})
        print("starting", line, report, child.process.poll() is not None, flush=True)
""")


def test_a_signal_at_any_line_of_the_main_threads_waits_drains() -> None:
    child = subprocess.run([sys.executable, "-c", SIGNAL_AT_EVERY_LINE], capture_output=True, text=True,
                           timeout=120, cwd=str(ROOT))
    said = [line for line in child.stdout.splitlines() if line.startswith(("waiting", "starting"))]
    assert child.returncode == 0 and len(said) == 24, child.stdout + child.stderr[-3000:]
    assert all(line.endswith("['stopped']") for line in said[:12]), said
    # Cancelled while it waited: nothing started (an empty report), the child killed.
    assert all(line.endswith("[] True") for line in said[12:]), said


def test_a_failing_or_hanging_drain_is_reported_and_bounded_by_the_deadline() -> None:
    journal: list[str] = []

    class BadDrain(Recorder):
        def drain(self, deadline: float) -> None:
            self.journal.append(f"drain:{self.name}")
            raise ConnectionError("broker frozen")

    class HungDrain(Recorder):
        def drain(self, deadline: float) -> None:
            self.journal.append(f"drain:{self.name}")
            time.sleep(60)

    system = System([Recorder("db", journal), BadDrain("workers", journal), HungDrain("http", journal)],
                    shutdown_timeout_s=1.5)
    system.start()
    began = time.monotonic()
    report = system.stop()
    took = time.monotonic() - began
    statuses = [(r.name, r.status) for r in report]
    assert statuses[:2] == [("http (drain)", "timeout"), ("workers (drain)", "failed")]
    assert statuses[2:] == [("http", "stopped"), ("workers", "stopped"), ("db", "stopped")]
    assert "broker frozen" in (report[1].error or "")
    # The hung drain was abandoned at the deadline; later drains and every stop still ran.
    assert took < 1.5 + OVERRUN_S + 1.0, took


class Rounds(PeriodicComponent):
    """Plays back ``outcomes`` as the results of its rounds (an exception is raised)."""

    name = "rounds"

    def __init__(self, outcomes: list[bool | Exception], *, interval_s: float) -> None:
        super().__init__(interval_s=interval_s)
        self.outcomes = outcomes
        self.ticks = 0

    def tick(self) -> bool | None:
        self.ticks += 1
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def test_periodic_component_goes_again_at_once_survives_a_failed_round_and_ends_at_drain() -> None:
    rounds = Rounds([True, RuntimeError("database blip")], interval_s=60)
    rounds.start()
    # The first round runs at start and asks for another at once; that one fails, and the loop
    # lives on to wait its interval.
    wait_until(lambda: rounds.ticks == 2, 5)
    time.sleep(0.2)
    assert rounds.ticks == 2 and rounds.alive()
    rounds.begin_drain()
    assert rounds.stopping()
    rounds.stop(5)
    assert rounds._thread is not None and not rounds._thread.is_alive()
    assert rounds.alive(), "a loop that was asked to stop did not die"


def test_a_periodic_failure_repeated_round_after_round_is_warned_of_once_and_its_end_said() -> None:
    # The scheduler on a database without its migrations warned of the same missing column
    # about 40 times a second.
    down, other = RuntimeError("column x does not exist"), RuntimeError("connection refused")
    rounds = Rounds([down, down, down, down, other, other, None], interval_s=0.01)
    with capture_logs() as logs:
        rounds.start()
        wait_until(lambda: rounds.ticks >= 7, 5)
        rounds.stop(5)
    warned = [(entry["error"], entry.get("failed_rounds")) for entry in logs if entry["log_level"] == "warning"]
    assert warned == [("RuntimeError: column x does not exist", 1), ("RuntimeError: connection refused", 5)]
    (recovered,) = [entry for entry in logs if entry["event"] == "rounds succeed again"]
    assert recovered["failed_rounds"] == 6 and recovered["last_error"] == "RuntimeError: connection refused"
    assert rounds.failed_rounds == 0


def test_periodic_component_that_keeps_running_through_the_drain() -> None:
    class Beats(Rounds):
        tick_at_start = False
        stop_on_drain = False

    beats = Beats([], interval_s=0.05)
    beats.start()
    beats.begin_drain()
    seen = beats.ticks
    wait_until(lambda: beats.ticks > seen + 1, 5, message="the loop stopped at begin_drain")
    beats.stop(5)
    assert beats._thread is not None and not beats._thread.is_alive()


# -- child processes under a supervisor's deadlines ---------------------------------------------------
STUBBORN = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('up', flush=True); time.sleep(120)"]


def test_a_child_that_ignores_sigterm_is_killed_within_the_stop_budget() -> None:
    # A gunicorn already stopping ignores a second SIGTERM: the supervisor's budget for it must
    # end with the child dead, not with the supervisor giving up and exiting around it.
    child = ProcessComponent("stubborn", STUBBORN)
    system = System([child], shutdown_timeout_s=3, stop_timeout_s=2)
    system.start()
    assert child.process is not None
    try:
        time.sleep(0.3)  # its SIGTERM handler is in place
        began = time.monotonic()
        report = system.stop(drain=False)
        assert time.monotonic() - began < 3
        assert [result.status for result in report] != ["timeout"], report
        assert child.process.poll() is not None, "the child outlived its stop"
    finally:
        if child.process.poll() is None:  # never leave it behind, whatever failed
            os.kill(child.process.pid, signal.SIGKILL)


# A worker process: ready once it has written its file; SIGTERM starts a drain of argv[3] seconds
# (its jobs finishing), with the moments the drain began and ended in its journal.
DRAINING_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path

    ready, journal, drain_s = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])

    def drain(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        journal.write_text(f"began {time.monotonic()}\\n")
        time.sleep(drain_s)
        with journal.open("a") as lines:
            lines.write(f"ended {time.monotonic()}\\n")
        sys.exit(0)

    signal.signal(signal.SIGTERM, drain)
    ready.write_text(f"{os.getpid()}\\n")
    while True:
        time.sleep(60)
""")
# A worker process that fails before it is ready, once the ones named in argv are up.
FAILS_ONCE_OTHERS_ARE_UP = textwrap.dedent("""
    import sys, time
    from pathlib import Path

    while not all(Path(path).exists() for path in sys.argv[1:]):
        time.sleep(0.01)
    sys.exit(3)
""")


def test_a_failed_start_drains_the_children_already_up_side_by_side_within_the_shutdown_timeout(
        tmp_path: Path) -> None:
    # runworkers --processes N, one child failing before it was ready: the rollback stopped the
    # children already up one after another without a drain, each SIGKILLed at its own stop
    # budget whatever --shutdown-timeout said, mid-job (the job ran again from the broker's
    # recovery), while those not yet signalled went on taking jobs.
    drain_s = 1.5
    up = [ProcessComponent(f"worker-{index}", [sys.executable, "-c", DRAINING_CHILD, str(tmp_path / f"ready-{index}"),
                                               str(tmp_path / f"journal-{index}"), str(drain_s)],
                           ready_file=tmp_path / f"ready-{index}")
          for index in range(2)]
    failing = ProcessComponent("worker-2", [sys.executable, "-c", FAILS_ONCE_OTHERS_ARE_UP,
                                            *(str(child.ready_file) for child in up)], ready_file=tmp_path / "ready-2")
    children = [*up, failing]
    # Each child's stop budget is shorter than its drain: the shutdown timeout is what bounds it.
    system = System([*children, AwaitReady("ready", children)], shutdown_timeout_s=10, stop_timeout_s=1)
    try:
        began = time.monotonic()
        with pytest.raises(SystemStartError, match="worker-2: exited with code 3 before it was ready") as caught:
            system.start()
        assert time.monotonic() - began < 10
        assert [(result.name, result.status) for result in caught.value.rollback] == [
            ("worker-2", "failed"), ("worker-1", "stopped"), ("worker-0", "stopped")], caught.value.rollback
        assert [child.process.returncode for child in up if child.process] == [0, 0], "killed mid-drain"
        journals = [dict(line.split() for line in (tmp_path / f"journal-{index}").read_text().splitlines())
                    for index in range(2)]
        assert max(float(j["began"]) for j in journals) < min(float(j["ended"]) for j in journals), \
            f"the children drained one after the other: {journals}"
    finally:
        for child in children:  # never leave one behind, whatever failed
            if child.process is not None and child.process.poll() is None:
                os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait()


SIGNALLED_DURING_START = textwrap.dedent("""
    import os, signal, sys, threading, time
    from composition.lifecycle import ProcessComponent
    from composition.lifecycle import System
    web = ProcessComponent("web", [sys.executable, "-c", "import time; time.sleep(120)"],
                           ready_url="http://127.0.0.1:" + sys.argv[1] + "/readyz", start_timeout_s=60)
    threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
    began = time.monotonic()
    report = System([web]).run()  # a stop, not a failed start: what started is stopped cleanly
    print("stopped after", round(time.monotonic() - began, 1), "child", web.process.poll(), "report", report,
          flush=True)
""")


def test_a_sigterm_during_start_up_rolls_back_at_once() -> None:
    from composition.testing import free_port

    child = subprocess.run([sys.executable, "-c", SIGNALLED_DURING_START, str(free_port())], capture_output=True,
                           text=True, timeout=60, cwd=str(ROOT))
    assert "stopped after" in child.stdout and "report []" in child.stdout, child.stdout + child.stderr[-2000:]
    took = float(child.stdout.split("stopped after")[1].split()[0])
    assert took < 5, f"the stop waited for the start-up ({took} s; the ready wait was 60 s)"
    assert "child None" not in child.stdout, "the child was left running"


def test_a_child_whose_parent_died_before_it_could_watch_ends_at_once() -> None:
    # The parent-death signal is set in the child after the fork: a parent killed in between
    # never sends it, and runworkers' children were left running as orphans, taking jobs.
    import functools

    from composition.lifecycle.processes import detach_and_die_with_parent

    orphan = subprocess.Popen(["sleep", "30"], preexec_fn=functools.partial(detach_and_die_with_parent, 1))
    assert orphan.wait(timeout=5) == 1  # pid 1 is not its parent: it ended before exec
    watched = subprocess.Popen(["sleep", "30"], preexec_fn=functools.partial(detach_and_die_with_parent, os.getpid()))
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            watched.wait(timeout=0.5)
    finally:
        watched.kill()
        watched.wait()


@pytest.mark.parametrize(("argument", "said"), [
    (["--threads", "0"], "--threads: '0' is not a whole number of at least 1"),
    (["--processes", "-1"], "--processes: '-1' is not a whole number of at least 1"),
    (["--shutdown-timeout", "nan"], "--shutdown-timeout: 'nan' is not a number of seconds"),
    (["--shutdown-timeout", "inf"], "--shutdown-timeout: 'inf' is not a number of seconds"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout: '-1' is not a number of seconds"),
    (["--queues", ","], "--queues: ',' names no queue"),
    # It spent 20 s creating threads until fork failed host-wide, and its rollback crashed.
    (["--threads", "99999999"], "--threads from 1 to 512 (WORKER_PROCESSES, WORKER_THREADS), got 1 and 99999999"),
])
def test_runworkers_refuses_bad_arguments_as_usage_errors(argument: list[str], said: str) -> None:
    from composition.testing import subprocess_env

    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "runworkers", *argument], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert said in done.stderr


def test_runworkers_refuses_a_queue_no_job_declares() -> None:
    """A misspelt queue would be consumed for nothing while the worker looks healthy."""
    from composition.testing import subprocess_env

    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "runworkers", "--queues", "reminder,default",
                           "--metrics-port", "off"], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]  # a usage error, as every other bad --queues
    assert "no queue named 'reminder' (the queues: " in done.stderr and "reminders" in done.stderr
    assert "Traceback" not in done.stderr
