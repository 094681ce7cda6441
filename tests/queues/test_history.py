"""The queues' history: what two processes add to one bucket, the runs each ended since its last
round, the last hour read back aligned on the buckets, and the chart drawn from it."""

from __future__ import annotations

import pytest

from composition.admin.charts import queue_chart
from composition.pauses import Pause, pause
from composition.queues.history import HISTORY_BUCKETS, EndedRuns, bucket_start, recent_buckets, record_buckets
from composition.queues.models import QueueBucket

pytestmark = pytest.mark.django_db

NOW = 1_790_000_040.0  # a fixed moment, a whole number of minutes
assert NOW % 60 == 0


def test_two_processes_add_to_one_bucket_the_largest_depth_and_their_runs() -> None:
    pause(Pause.QUEUE, "held", by="ops")
    record_buckets({"busy": 30, "held": 7}, {"busy": (10, 2)}, now_s=NOW + 5)
    record_buckets({"busy": 20, "held": None}, {"busy": (5, 0)}, now_s=NOW + 40)  # another process
    record_buckets({"busy": 5}, {}, now_s=NOW + 65)  # the next minute
    busy = list(QueueBucket.objects.filter(queue="busy").order_by("started_at").values_list(
        "depth", "processed", "failed", "paused"))
    assert busy == [(30, 15, 2, False), (5, 0, 0, False)]
    held = QueueBucket.objects.get(queue="held")
    assert (held.depth, held.paused, held.shed) == (7, True, False)  # an unknown depth never lowers it


def test_ended_runs_are_counted_since_the_last_round() -> None:
    ended = EndedRuns()
    assert ended.since_last({("a", False): 3, ("a", True): 1}) == {"a": (4, 1)}
    assert ended.since_last({("a", False): 5, ("a", True): 1, ("b", True): 2}) == {"a": (2, 0), "b": (2, 2)}
    assert ended.since_last({("a", False): 5, ("a", True): 1, ("b", True): 2}) == {}


def test_the_last_hour_reads_back_aligned_with_gaps_and_rates_per_minute() -> None:
    record_buckets({"q": 12}, {"q": (6, 3)}, now_s=NOW - 600)
    record_buckets({"q": 4}, {}, now_s=NOW)
    record_buckets({"q": 99}, {}, now_s=NOW - 3600)  # older than the hour: not shown
    history = recent_buckets(["q", "empty"], now_s=NOW + 30)["q"]
    assert len(history) == HISTORY_BUCKETS and history[-1] is not None and history[-1].depth == 4
    ten_minutes_ago = history[-11]
    assert ten_minutes_ago is not None and (ten_minutes_ago.depth, ten_minutes_ago.processed_per_min,
                                            ten_minutes_ago.failed_per_min) == (12, 6.0, 3.0)
    assert sum(bucket is not None for bucket in history) == 2
    assert recent_buckets(["empty"], now_s=NOW)["empty"] == [None] * HISTORY_BUCKETS
    assert bucket_start(NOW + 3.5, 2.0).timestamp() == NOW + 2


def test_the_chart_draws_each_series_and_marks_paused_and_shed_buckets() -> None:
    pause(Pause.QUEUE, "q", by="shedding", shed=True)
    record_buckets({"q": 10}, {"q": (4, 1)}, now_s=NOW - 60)
    Pause.objects.filter(name="q").update(paused=False)
    record_buckets({"q": 0}, {"q": (8, 0)}, now_s=NOW)
    svg = str(queue_chart("q", recent_buckets(["q"], now_s=NOW + 1)["q"]))
    assert svg.count('class="pause-mark shed"') == 1 and "<title>shed at" in svg
    assert 'data-depth="' + "," * (HISTORY_BUCKETS - 2) + '10,0"' in svg
    assert 'data-processed="' + "," * (HISTORY_BUCKETS - 2) + '4,8"' in svg
    for line in ("depth", "processed", "failed"):
        assert f'<polyline class="{line}" points="' in svg
    # The queue's name is escaped wherever it goes.
    assert "<b>" not in str(queue_chart("<b>", [None] * HISTORY_BUCKETS))
