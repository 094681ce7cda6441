"""The limits' scripts against the real Redis: never more than N slots held at once however many
threads race for them, a lease that is not renewed comes back at its TTL, no window of the
server's clock holds more starts than the rate, and a refused start is told a turn in a line,
not a retry loop."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import pytest
from django.test import override_settings

from composition.conf import conf
from composition.limits import JobLimits, LimitStore, Rate, limit_store
from tests.helpers import unique


@pytest.fixture
def store() -> Iterator[LimitStore]:
    """The limits' store; the keys of this module's jobs (all named ``limit...``) deleted after."""
    store = limit_store()
    yield store
    keys = list(store.client.scan_iter(match=f"{store.prefix}limit*", count=1000))
    if keys:
        store.client.delete(*keys)


def _server_now(store: LimitStore) -> float:
    seconds, micros = store.client.time()
    return float(seconds) + micros / 1e6


def test_rates_parse_as_written_and_bad_ones_say_what_is_expected() -> None:
    assert Rate.parse("100/10s") == Rate(100, 10.0)
    assert Rate.parse("5/s") == Rate(5, 1.0)
    assert Rate.parse("600/1m") == Rate(600, 60.0)
    assert Rate.parse(" 20 / 500ms ") == Rate(20, 0.5)
    for bad in ("100", "100/10", "0/1s", "ten/1s", "5/0s", "5/2d", "-1/1s", ""):
        with pytest.raises(ValueError, match=r"rate|start|window"):
            Rate.parse(bad)
    # The window as given: "got 86400 s" for a day and 0.4 ms was no help.
    with pytest.raises(ValueError, match=r"got 86400\.0004 s"):
        Rate.parse("1/86400.0004s")
    assert JobLimits.of(None, None) is None
    assert JobLimits.of(5, "50/5s") == JobLimits(5, Rate(50, 5.0))
    for starts in (2.5, True, "5", 0):
        with pytest.raises(ValueError, match="whole number of starts"):
            JobLimits.of(None, Rate(starts, 10.0))  # type: ignore[arg-type]
    for concurrency in (0, -1, 1.5, True, "5"):
        with pytest.raises(ValueError, match="concurrency"):
            JobLimits.of(concurrency, None)  # type: ignore[arg-type]


def test_no_more_than_n_slots_are_held_at_once_whatever_the_number_of_racing_threads(store: LimitStore) -> None:
    actor, limits = unique("limit"), JobLimits(concurrency=3)
    holding = 0
    most = 0
    runs = 0
    lock = threading.Lock()
    stop = time.monotonic() + 2.0

    def worker(index: int) -> None:
        nonlocal holding, most, runs
        n = 0
        while time.monotonic() < stop:
            token = f"{index}-{n}"
            n += 1
            if not limit_store().admit(actor, limits, token).started:
                time.sleep(0.002)
                continue
            with lock:
                holding += 1
                most = max(most, holding)
                runs += 1
            time.sleep(0.005)
            with lock:
                holding -= 1
            assert limit_store().release(actor, token)

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most == 3, most
    assert runs > 100, runs
    assert store.state(actor, limits).slots_held == 0


def test_a_slot_nobody_renews_comes_back_at_its_ttl_and_a_renewed_one_does_not(store: LimitStore) -> None:
    actor, limits = unique("limit"), JobLimits(concurrency=2)
    with override_settings(COMPOSITION={**conf.as_dict(), "LIMIT_SLOT_TTL_S": 0.4}):
        assert store.admit(actor, limits, "renewed").started
        assert store.admit(actor, limits, "abandoned").started
        refused = store.admit(actor, limits, "third")
        assert not refused.started and refused.kind == "concurrency" and refused.delay_s > 0
        for _ in range(4):  # well past the TTL, renewing only one of the two
            time.sleep(0.2)
            assert store.renew(actor, ["renewed"]) == []
        assert store.admit(actor, limits, "third").started  # the abandoned slot came back
        assert not store.admit(actor, limits, "fourth").started  # the renewed one did not
        assert store.renew(actor, ["abandoned"]) == ["abandoned"]  # lost, and told so
        assert not store.release(actor, "abandoned")
        assert store.release(actor, "renewed") and store.release(actor, "third")
        assert store.state(actor, limits).slots_held == 0


def test_refused_starts_take_turns_spaced_by_the_mean_run_time_not_a_retry_loop(store: LimitStore) -> None:
    actor, limits = unique("limit"), JobLimits(concurrency=2)
    seconds, micros = store.client.time()
    started = store.admit(actor, limits, "a")
    # Its time on the server's clock, the one a rate is counted on.
    assert started.started and started.at_s == pytest.approx(seconds + micros / 1e6, abs=0.5)
    time.sleep(0.3)
    assert store.release(actor, "a")  # the mean run time is now about 300 ms
    assert store.state(actor, limits).mean_run_s == pytest.approx(0.3, abs=0.1)
    assert store.admit(actor, limits, "b").started and store.admit(actor, limits, "c").started
    delays = [store.admit(actor, limits, f"waiting-{index}").delay_s for index in range(6)]
    # The first turn is the first running job's expected end; each next one half a slot's
    # worth later (mean 0.3 s / 2 slots / 3 turns): spread out, growing with the line.
    assert 0.15 < delays[0] < 0.4, delays
    steps = [later - earlier for earlier, later in itertools.pairwise(delays)]
    assert all(0.04 < step < 0.11 for step in steps), delays
    state = store.state(actor, limits)
    assert (state.slots_held, state.delayed_by_concurrency) == (2, 6)


def test_a_run_past_its_mean_sends_the_waiting_ones_back_as_long_again_not_into_a_loop(store: LimitStore) -> None:
    # A fast job's mean run time rounds down to 0 ms; then one run holds the only slot for long.
    # Its expected end (start + mean) lay in the past, so every refused start was told to come
    # back at once: thousands of put-backs a second for as long as the run lasted.
    actor, limits = unique("limit"), JobLimits(concurrency=1)
    for index in range(40):
        assert store.admit(actor, limits, f"quick-{index}").started
        assert store.release(actor, f"quick-{index}")
    mean_run_s = store.state(actor, limits).mean_run_s
    assert mean_run_s is not None and mean_run_s < 0.005
    assert store.admit(actor, limits, "slow").started
    time.sleep(0.5)
    delays = [store.admit(actor, limits, f"waiting-{index}").delay_s for index in range(5)]
    # It has run 0.5 s: expected to take as long again, so the waiting ones come back then.
    assert all(0.4 < delay < 1.0 for delay in delays), delays


def test_runs_that_got_short_bring_the_waiting_ones_back_soon_not_after_the_old_mean(store: LimitStore) -> None:
    # 20 s runs, then 0.2 s ones: the mean (an average) still said many seconds, and the waiting
    # ones were told to come back then while both slots stood free after 0.2 s.
    actor, limits = unique("limit"), JobLimits(concurrency=2)
    store.client.hset(f"{store.prefix}{actor}:meta", "mean_run_ms", 12_000)
    assert store.admit(actor, limits, "short").started
    time.sleep(0.2)
    assert store.release(actor, "short")
    assert store.state(actor, limits).mean_run_s > 9  # the average has hardly moved
    assert store.admit(actor, limits, "a").started and store.admit(actor, limits, "b").started
    delays = [store.admit(actor, limits, f"waiting-{index}").delay_s for index in range(4)]
    # Twice the last run (0.4 s), but no less than an eighth of the mean (now 9.64 s: 1.2 s),
    # spaced by a sixth of that: not 9.6 s, then 1.6 s apart.
    assert 1.0 < delays[0] < 1.5 and 0.15 < delays[1] - delays[0] < 0.25, delays

    # One run that ended at once (a quick failure) does not send the line back every few ms.
    store.client.hset(f"{store.prefix}{actor}:meta", mapping={"mean_run_ms": 20_000, "last_run_ms": 0})
    quick = [store.admit(actor, limits, f"after-quick-{index}").delay_s for index in range(3)]
    assert all(delay >= 2.4 for delay in quick), quick


def test_a_long_line_comes_back_after_the_longest_delay_without_growing(store: LimitStore) -> None:
    actor, limits = unique("limit"), JobLimits(concurrency=1)
    assert store.admit(actor, limits, "first").started
    time.sleep(0.1)
    assert store.release(actor, "first")  # mean run time about 100 ms: turns 33 ms apart
    with override_settings(COMPOSITION={**conf.as_dict(), "LIMIT_MAX_DELAY_S": 0.5}):
        assert store.admit(actor, limits, "running").started
        delays = [store.admit(actor, limits, f"w{index}").delay_s for index in range(24)]
    assert delays[0] < 0.2, delays
    # The server's clock moves on between the admits: on a loaded machine a turn past the cap
    # reads a few milliseconds under it (0.495 after two 0.5s, in a gate).
    capped = [delay for delay in delays if delay >= 0.5 - 0.02]
    assert delays[-len(capped):] == capped and len(capped) >= 4, delays  # past the cap: the cap, always
    assert delays[:-len(capped)] == sorted(delays[:-len(capped)]), delays


def test_no_window_of_the_server_clock_holds_more_starts_than_the_rate(store: LimitStore) -> None:
    actor, limits = unique("limit"), JobLimits(rate=Rate(5, 0.5))
    starts: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + 2.2

    def worker(index: int) -> None:
        n = 0
        while time.monotonic() < stop:
            admission = limit_store().admit(actor, limits, f"{index}-{n}")
            n += 1
            if admission.started:
                with lock:
                    starts.append(_server_now(limit_store()))
            else:
                time.sleep(min(admission.delay_s, 0.05))

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    starts.sort()
    # Times read right after each admission: a window of the admissions' own clock holds at most
    # 5, so one of these (later by a round trip) can only spread them further apart... except at a
    # window's edge; allow for that round trip.
    for index in range(len(starts) - 5):
        assert starts[index + 5] - starts[index] > 0.5 - 0.02, starts[index:index + 6]
    assert 5 * 4 <= len(starts) <= 5 * 5 + 5, len(starts)  # about every allowed start was used


def test_a_start_over_the_rate_is_told_when_the_oldest_leaves_the_window(store: LimitStore) -> None:
    actor, limits = unique("limit"), JobLimits(rate=Rate(3, 1.0))
    for index in range(3):
        assert store.admit(actor, limits, f"s{index}").started
    refused = store.admit(actor, limits, "over")
    assert not refused.started and refused.kind == "rate"
    assert 0.8 < refused.delay_s <= 1.05, refused  # the window, and its margin of 20 ms
    time.sleep(refused.delay_s)
    assert store.admit(actor, limits, "over").started
    state = store.state(actor, limits)
    assert 1 <= state.starts_in_window <= 3  # "over", and those of the first three still in it
    assert (state.delayed_by_rate, state.slots_held) == (1, 0)


def test_a_job_with_both_limits_logs_no_start_that_its_concurrency_refused(store: LimitStore) -> None:
    actor, limits = unique("limit"), JobLimits(concurrency=1, rate=Rate(10, 5.0))
    assert store.admit(actor, limits, "a").started
    assert store.admit(actor, limits, "b").kind == "concurrency"
    assert store.state(actor, limits).starts_in_window == 1
