"""The worker heartbeat's metric, against a cache Redis that refuses it."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.test import override_settings
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from composition.lifecycle.heartbeat import HeartbeatComponent
from composition.testing import free_port


@pytest.mark.django_db
def test_a_beat_the_cache_redis_refuses_still_moves_the_process_s_metric() -> None:
    # The metric moved only once the beat was written to Redis: with only the cache's Redis down,
    # a worker that went on consuming paged WorkerHeartbeatStale ("nothing consumes: restart it").
    caches = {**settings.CACHES, "default": {**settings.CACHES["default"],
                                              "LOCATION": f"redis://127.0.0.1:{free_port()}/0"}}
    before = time.time()
    with override_settings(CACHES=caches), capture_logs() as logs:
        beat = HeartbeatComponent(60.0, state=lambda: {})
        beat.start()
        beat.stop(5.0)
    assert [entry for entry in logs if entry["event"] == "heartbeat failed"], "the beat reached Redis"
    beaten = REGISTRY.get_sample_value("composition_worker_heartbeat_timestamp_seconds", {"role": "worker"})
    assert beaten is not None and beaten >= before
