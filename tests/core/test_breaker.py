"""``CircuitBreaker``'s state machine: closed → open after ``failure_threshold`` failures in a row,
open for ``reset_timeout_s``, then half-open, where trial calls (or a background probe alone)
close it or open it again; its metrics and ``breaker_states()``. A test clock drives time."""

from __future__ import annotations

import gc
import threading

import pytest
import structlog
from structlog.testing import capture_logs

from composition import breaker as breaker_module
from composition.breaker import CircuitBreaker, CircuitOpen, breaker_states
from composition.jobs import TransientError
from composition.testing import metric_value, wait_until
from tests.helpers import Clock, unique


def _raise_connection_error() -> None:
    raise ConnectionError("refused")


def _raise_key_error() -> None:
    raise KeyError("missing")


def _opened(breaker: CircuitBreaker) -> None:
    for _ in range(breaker.failure_threshold):
        breaker.record_failure()
    assert breaker.state == "open"


def test_circuit_opens_after_the_threshold_and_half_opens_after_the_timeout() -> None:
    clock = Clock()
    breaker = CircuitBreaker("payments-api", failure_threshold=3, reset_timeout_s=10, clock=clock)
    calls: list[str] = []

    def failing() -> None:
        calls.append("called")
        raise ConnectionError("down")

    for _ in range(3):
        with pytest.raises(ConnectionError):
            breaker.call(failing)
    assert breaker.state == "open"
    with pytest.raises(CircuitOpen) as caught:
        breaker.call(failing)
    assert isinstance(caught.value, TransientError)  # a job hitting it retries later
    assert len(calls) == 3 and caught.value.retry_after_s == pytest.approx(10)

    clock.now += 10
    assert breaker.state == "half_open"
    with pytest.raises(ConnectionError):
        breaker.call(failing)  # the one trial fails: open again, for a full period
    assert breaker.state == "open"
    clock.now += 10
    assert breaker.call(lambda: "ok") == "ok"
    assert breaker.state == "closed"


def test_half_open_lets_only_the_allowed_trial_calls_through() -> None:
    clock = Clock()
    breaker = CircuitBreaker("slow", failure_threshold=1, reset_timeout_s=1, half_open_max_calls=1, clock=clock)
    with pytest.raises(ValueError), breaker:
        raise ValueError("boom")
    clock.now += 1
    inside = threading.Event()
    release = threading.Event()
    results: list[str] = []

    def trial() -> None:
        def slow() -> str:
            inside.set()
            release.wait(5)
            return "ok"

        results.append(breaker.call(slow))

    thread = threading.Thread(target=trial)
    thread.start()
    inside.wait(5)
    with pytest.raises(CircuitOpen):
        breaker.call(lambda: "second trial")
    release.set()
    thread.join(5)
    assert results == ["ok"] and breaker.state == "closed"


def test_only_failure_types_count_and_successes_reset_the_count() -> None:
    breaker = CircuitBreaker("picky", failure_threshold=2, reset_timeout_s=1, failure_types=(ConnectionError,))
    for _ in range(5):
        with pytest.raises(KeyError):
            breaker.call(_raise_key_error)
    assert breaker.state == "closed"
    with pytest.raises(ConnectionError):
        breaker.call(_raise_connection_error)
    breaker.call(lambda: None)
    with pytest.raises(ConnectionError):
        breaker.call(_raise_connection_error)
    assert breaker.state == "closed"  # never two failures in a row

    @breaker
    def decorated() -> str:
        """Docstring kept."""
        return "x"

    assert decorated() == "x" and decorated.__doc__ == "Docstring kept."
    with pytest.raises(ValueError):
        CircuitBreaker("bad", failure_threshold=0, reset_timeout_s=1)


def test_with_a_probe_only_the_probe_closes_the_circuit_and_callers_never_wait_for_it() -> None:
    clock = Clock()
    started, release = threading.Event(), threading.Event()
    outcomes: list[bool] = [False, True]  # the first probe fails, the second succeeds
    probes: list[str] = []

    def probe() -> None:
        probes.append("probe")
        started.set()
        release.wait(5)
        if not outcomes.pop(0):
            raise ConnectionError("still down")

    breaker = CircuitBreaker("with-probe", failure_threshold=2, reset_timeout_s=10, clock=clock, probe=probe)
    assert breaker.allow()
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.is_open and not breaker.allow()
    breaker.record_success()  # a call let through before it opened: no trial, still open
    assert breaker.state == "open"

    clock.now += 10
    assert breaker.state == "open"  # reading the state starts nothing
    assert not breaker.allow()  # starts the probe in the background; this caller is refused
    assert started.wait(5) and breaker.state == "half_open"
    with pytest.raises(CircuitOpen):
        breaker.call(lambda: "no trial calls")
    release.set()
    wait_until(lambda: breaker.state == "open", 5, message="the failed probe did not reopen it")
    assert not breaker.allow()  # a full period again

    started.clear()
    clock.now += 10
    assert not breaker.allow()
    wait_until(lambda: breaker.state == "closed", 5, message="the successful probe did not close it")
    assert probes == ["probe", "probe"]
    assert breaker.allow() and not breaker.is_open
    assert breaker.call(lambda: "ok") == "ok"


@pytest.mark.parametrize("arguments", [
    {"failure_threshold": 0, "reset_timeout_s": 1},
    {"failure_threshold": 1, "reset_timeout_s": 1, "half_open_max_calls": 0},
    {"failure_threshold": 1, "reset_timeout_s": 0},
    {"failure_threshold": 1, "reset_timeout_s": -5},
    {"failure_threshold": 1, "reset_timeout_s": float("nan")},
    {"failure_threshold": 1, "reset_timeout_s": float("inf")},
], ids=["no-threshold", "no-trial-call", "zero-timeout", "negative-timeout", "nan-timeout", "inf-timeout"])
def test_a_breaker_that_could_never_open_or_never_recover_is_refused(arguments: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        CircuitBreaker("refused", **arguments)  # type: ignore[arg-type]


def test_the_outcome_of_a_call_let_through_before_it_opened_neither_closes_it_nor_keeps_it_open() -> None:
    clock = Clock()
    breaker = CircuitBreaker(unique("late"), failure_threshold=2, reset_timeout_s=10, clock=clock)
    assert breaker.allow() and breaker.allow() and breaker.allow()  # three calls go out, closed
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state == "open"
    breaker.record_success()  # the third, slow, still answered: no trial, it stays open
    assert breaker.state == "open" and not breaker.allow()
    clock.now += 9
    breaker.record_failure()  # a late failure: the reset timeout still counts from the opening
    clock.now += 1.5
    assert breaker.state == "half_open"
    assert breaker.allow()  # the trial call
    breaker.record_success()
    assert breaker.state == "closed"


def test_a_refusal_says_how_long_until_a_trial_and_every_refusal_is_counted() -> None:
    clock = Clock()
    name = unique("breaker-")
    breaker = CircuitBreaker(name, failure_threshold=2, reset_timeout_s=10, clock=clock)

    def state_gauge() -> float:
        return metric_value("composition_circuit_state", name=name)

    def rejections() -> float:
        return metric_value("composition_circuit_rejections_total", name=name)

    assert (state_gauge(), breaker.is_open) == (0, False)
    breaker.record_failure()
    assert breaker.state == "closed" and state_gauge() == 0  # one failure is not yet an outage
    breaker.record_failure()
    assert (breaker.state, state_gauge(), breaker.is_open) == ("open", 2, True)

    clock.now += 4
    with pytest.raises(CircuitOpen) as caught:
        breaker.call(_raise_connection_error)
    assert caught.value.retry_after_s == pytest.approx(6) and caught.value.name == name
    assert not breaker.allow()
    assert rejections() == 2, "each refused call is counted, nothing else"

    clock.now += 6
    assert (breaker.state, state_gauge(), breaker.is_open) == ("half_open", 1, True)
    assert breaker.allow()  # the trial: let through, not counted as a rejection
    assert not breaker.allow()
    assert rejections() == 3
    breaker.record_success()
    assert (breaker.state, state_gauge(), breaker.is_open) == ("closed", 0, False)


def test_the_with_and_decorator_forms_refuse_without_running_the_body_while_open() -> None:
    breaker = CircuitBreaker(unique("breaker-"), failure_threshold=1, reset_timeout_s=60, clock=Clock())
    ran: list[str] = []

    @breaker
    def guarded() -> None:
        ran.append("decorated")
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        guarded()  # the failure passes through, and opens the circuit
    with pytest.raises(CircuitOpen):
        guarded()
    with pytest.raises(CircuitOpen), breaker:
        ran.append("with block")
    assert ran == ["decorated"]


def test_with_allow_and_record_the_trial_count_bounds_half_open_calls() -> None:
    clock = Clock()
    breaker = CircuitBreaker(unique("breaker-"), failure_threshold=3, reset_timeout_s=5, half_open_max_calls=2,
                             clock=clock)
    _opened(breaker)
    assert not breaker.allow()
    clock.now += 5
    assert [breaker.allow() for _ in range(3)] == [True, True, False]
    breaker.record_failure()  # one trial fails: open at once, though the threshold is 3
    assert breaker.state == "open"
    clock.now += 5
    assert [breaker.allow() for _ in range(3)] == [True, True, False], "a new half-open period, new trials"
    breaker.record_success()
    assert breaker.state == "closed"
    # Closed again, the failure count starts from zero: two failures do not reopen it.
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state == "closed"


def test_an_answer_that_is_not_a_failure_closes_a_half_open_circuit() -> None:
    clock = Clock()
    breaker = CircuitBreaker(unique("breaker-"), failure_threshold=1, reset_timeout_s=5,
                             failure_types=(ConnectionError,), clock=clock)
    with pytest.raises(ConnectionError):
        breaker.call(_raise_connection_error)
    clock.now += 5
    with pytest.raises(KeyError):
        breaker.call(_raise_key_error)  # the dependency answered, with an error of the caller's
    assert breaker.state == "closed"


def test_after_close_runs_once_the_probe_closed_it_and_its_failure_leaves_it_closed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The module's logger is cached on first use; a later configure_structlog() (a LoggerComponent
    # an earlier test started) gives the config a new processor list, and capture_logs fills that
    # one, not the cached logger's: a fresh logger for this test, so the order of tests is moot.
    monkeypatch.setattr(breaker_module, "log", structlog.get_logger("composition.backpressure"))
    clock = Clock()
    outcomes = [False, True]
    after_close: list[str] = []

    def probe() -> None:
        if not outcomes.pop(0):
            raise ConnectionError("still down")

    def failing_after_close() -> None:
        after_close.append("ran")
        raise RuntimeError("replay failed")

    name = unique("breaker-")
    breaker = CircuitBreaker(name, failure_threshold=1, reset_timeout_s=5, clock=clock, probe=probe,
                             after_close=failing_after_close)
    _opened(breaker)
    with capture_logs() as logs:
        clock.now += 5
        assert not breaker.allow()
        wait_until(lambda: len(outcomes) == 1 and breaker.state == "open", 5,
                   message="the failed probe did not reopen it")
        assert after_close == [], "a failed probe closes nothing"
        clock.now += 5
        assert not breaker.allow()
        wait_until(lambda: after_close == ["ran"], 5, message="after_close never ran")
        wait_until(lambda: any(e["event"] == "circuit after-close step failed" for e in logs), 5)
    assert breaker.state == "closed"
    assert [e["circuit"] for e in logs if e["event"] == "circuit probe failed"] == [name]
    [failed] = [e for e in logs if e["event"] == "circuit after-close step failed"]
    assert failed["error"] == "replay failed"


def test_breaker_states_names_the_worst_state_per_name_and_forgets_dropped_breakers() -> None:
    # One failing breaker among healthy ones of its name, in several rounds: whatever order the
    # weak set yields them in, the failing one must win every round.
    for _ in range(5):
        name = unique("breaker-")
        healthy = [CircuitBreaker(name, failure_threshold=1, reset_timeout_s=60) for _ in range(6)]
        failing = CircuitBreaker(name, failure_threshold=1, reset_timeout_s=60)
        assert breaker_states()[name] == "closed"
        failing.record_failure()
        states = breaker_states()
        assert states[name] == "open"
        assert list(states) == sorted(states)

        del failing
        gc.collect()
        assert breaker_states()[name] == "closed", "a dropped breaker still reported"
        healthy.clear()
        gc.collect()
        assert name not in breaker_states()
