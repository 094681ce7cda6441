"""The archive of dead processes' metrics, with real processes writing the multiprocess directory:
totals never go down, live gauges go, and a scrape never sees a merge halfway."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from prometheus_client import CollectorRegistry, Gauge

from composition import metrics
from composition.prometheus import (
    LockedMultiProcessCollector,
    MetricsDirectoryBusy,
    archive_dead_processes,
    archive_processes,
)
from composition.prometheus import archive as archive_module
from composition.prometheus.directory import locked, process_files
from composition.testing import wait_until
from composition.testing.metric_writer import expected_jobs, run_writer, writer_argv

MERGED_GAUGES = ("min", "max", "sum", "mostrecent")
LIVE_GAUGES = ("liveall", "livemin", "livemax", "livesum", "livemostrecent")


def _registry(directory: Path) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(LockedMultiProcessCollector(directory))
    return registry


def _samples(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by name and labels."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for metric in _registry(directory).collect() for sample in metric.samples}


def _jobs_total(directory: Path) -> float:
    return sum(value for (name, _), value in _samples(directory).items() if name == "composition_jobs_total")


def _without_live_gauges(samples: dict) -> dict:  # type: ignore[type-arg]
    # The writer's own test gauges, and composition's live ones (the writer imports them all).
    live = {f"testing_gauge_{mode}" for mode in LIVE_GAUGES} | {
        gauge._name for gauge in vars(metrics).values()
        if isinstance(gauge, Gauge) and gauge._multiprocess_mode.startswith("live")}
    return {key: value for key, value in samples.items() if key[0] not in live}


@pytest.fixture
def staying_writers(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Writers that stay alive until killed; every one is killed at teardown."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def _start_staying(directory: Path, jobs: int, started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(writer_argv(jobs, stay=True, announce=True), stdout=subprocess.PIPE,
                               env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)})
    started.append(process)
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"
    return process


def test_archiving_dead_processes_keeps_every_total_and_drops_their_live_gauges(tmp_path: Path) -> None:
    pids = [run_writer(tmp_path, jobs, value) for jobs, value in ((7, 3.0), (11, 1.0), (5, 2.0))]
    before = _samples(tmp_path)

    assert archive_processes(tmp_path, pids) > 0

    after = _samples(tmp_path)
    # Counters, histograms (buckets, _sum, _count) and min/max/sum/mostrecent gauges: unchanged
    # (up to the float rounding of summing the same values in another order).
    assert after == pytest.approx(_without_live_gauges(before), rel=1e-12)
    assert after[("testing_gauge_max", ())] == 3.0
    assert after[("testing_gauge_min", ())] == 1.0
    assert after[("testing_gauge_sum", ())] == 6.0
    assert after[("testing_gauge_mostrecent", ())] == 2.0  # the last writer's
    assert sum(value for (name, _), value in after.items() if name == "composition_jobs_total") == 23
    # "all" gauges are one series per process, alive or dead: kept, each with its pid.
    assert {dict(labels)["pid"] for (name, labels) in after if name == "testing_gauge_all"} == {str(p) for p in pids}
    # What is left in the directory: the archives, and only the dead processes' "all" gauges.
    assert {f.prefix for f in process_files(tmp_path)} == {"gauge_all"}
    assert (tmp_path / "counter_archive.db").exists() and (tmp_path / "histogram_archive.db").exists()


def test_each_merge_adds_to_the_archive(tmp_path: Path) -> None:
    first = [run_writer(tmp_path, 9) for _ in range(2)]
    archive_processes(tmp_path, first)
    second = [run_writer(tmp_path, 4) for _ in range(3)]
    archive_processes(tmp_path, second)

    samples = _samples(tmp_path)
    expected = {key: 2 * expected_jobs(9).get(key, 0) + 3 * expected_jobs(4).get(key, 0)
                for key in expected_jobs(9).keys() | expected_jobs(4).keys()}
    for (actor, outcome), count in expected.items():
        labels = tuple(sorted({"actor": actor, "outcome": outcome}.items()))
        assert samples[("composition_jobs_total", labels)] == count
    assert samples[("composition_job_duration_seconds_count", (("actor", "notify"),))] == (
        2 * len(range(3, 9, 4)) + 3 * len(range(3, 4, 4)))


def test_leftovers_of_processes_that_no_longer_run_are_archived_and_the_living_left_alone(
        tmp_path: Path, staying_writers: list[subprocess.Popen[bytes]]) -> None:
    dead = [run_writer(tmp_path, 6) for _ in range(3)]
    living = _start_staying(tmp_path, 10, staying_writers)
    assert _jobs_total(tmp_path) == 28

    assert archive_dead_processes(tmp_path) == sorted(dead)

    assert {f.pid for f in process_files(tmp_path) if f.prefix == "counter"} == {living.pid}
    assert _jobs_total(tmp_path) == 28
    living.send_signal(signal.SIGTERM)
    living.wait(10)
    assert archive_dead_processes(tmp_path) == [living.pid]
    assert not [f for f in process_files(tmp_path) if f.prefix != "gauge_all"]
    assert _jobs_total(tmp_path) == 28


def test_scrapes_during_merges_never_see_a_process_twice_or_not_at_all(tmp_path: Path) -> None:
    pids = [run_writer(tmp_path, 5) for _ in range(12)]
    expected = 12 * 5
    seen: list[float] = []
    done = threading.Event()

    def scrape() -> None:
        while not done.is_set():
            seen.append(_jobs_total(tmp_path))

    # Three scrapers back to back (several Prometheus servers): their shared locks overlap, and
    # a merge must still get its turn, not starve until it gives up.
    scrapers = [threading.Thread(target=scrape) for _ in range(3)]
    for scraper in scrapers:
        scraper.start()
    try:
        wait_until(lambda: len(seen) > 2, 10)
        for pid in pids:  # one merge per process, as a supervisor reaps its children one by one
            archive_processes(tmp_path, [pid], timeout_s=5.0)
        wait_until(lambda: len(seen) > 2 * len(pids), 10)
    finally:
        done.set()
        for scraper in scrapers:
            scraper.join()
    assert set(seen) == {expected}, sorted(set(seen))
    assert not [f for f in process_files(tmp_path) if f.prefix == "counter"]


def test_a_merge_waits_for_a_scrape_in_progress_and_gives_up_without_changing_anything(tmp_path: Path) -> None:
    pid = run_writer(tmp_path, 3)
    files = sorted([*os.listdir(tmp_path), "merge.lock", "merge.turnstile"])
    with locked(tmp_path, exclusive=False), pytest.raises(MetricsDirectoryBusy):
        archive_processes(tmp_path, [pid], timeout_s=0.2)
    assert sorted(os.listdir(tmp_path)) == files
    assert archive_processes(tmp_path, [pid]) > 0  # the scrape is over: it goes through


def test_a_merge_whose_merger_died_after_committing_is_finished_before_the_next_scrape_reads(
        tmp_path: Path) -> None:
    pids = [run_writer(tmp_path, 8) for _ in range(3)]
    archive_processes(tmp_path, pids[:1])
    # The merger dies right after its commit point (the journal), before it applied anything:
    # forced here, since a real kill cannot be aimed between two lines.
    with mock.patch.object(archive_module, "_apply", side_effect=RuntimeError("killed")), \
            pytest.raises(RuntimeError):
        archive_processes(tmp_path, pids[1:])
    assert archive_module.interrupted(tmp_path)

    assert _jobs_total(tmp_path) == 24  # neither twice (archive and files) nor lost

    assert not archive_module.interrupted(tmp_path)
    assert not [f for f in process_files(tmp_path) if f.prefix == "counter"]
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".pending")]


def test_a_merge_that_died_before_committing_leaves_the_old_state(tmp_path: Path) -> None:
    pids = [run_writer(tmp_path, 8) for _ in range(2)]
    with mock.patch.object(archive_module.os, "replace", side_effect=RuntimeError("killed")), \
            pytest.raises(RuntimeError):
        archive_processes(tmp_path, pids)
    assert [name for name in os.listdir(tmp_path) if name.endswith(".pending")]

    assert _jobs_total(tmp_path) == 16
    assert archive_processes(tmp_path, pids) > 0  # the next merge discards the leftovers first
    assert _jobs_total(tmp_path) == 16
    assert not [name for name in os.listdir(tmp_path) if name.endswith((".pending", ".tmp"))]


def test_a_file_caught_between_its_creation_and_its_sizing_is_read_as_empty(tmp_path: Path) -> None:
    # prometheus_client creates a process's file empty and sizes it right after; a scrape or a
    # merge may find it empty in between (or for good, when the process died right there).
    pid = run_writer(tmp_path, 4)
    short_lived = subprocess.Popen(["true"])
    short_lived.wait()
    (tmp_path / f"histogram_{short_lived.pid}.db").touch()

    assert _jobs_total(tmp_path) == 4
    assert sorted(archive_dead_processes(tmp_path)) == sorted({pid, short_lived.pid})
    assert _jobs_total(tmp_path) == 4
    assert not (tmp_path / f"histogram_{short_lived.pid}.db").exists()
