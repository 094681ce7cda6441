"""The operations page's charts in headless Chromium, drawn from what a real worker recorded: a
queue an operator paused shows its pause mark, a queue a worker drains shows its depth falling
and its runs per minute; the screenshot is saved. Buckets of 2 s stand in for the minute."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.test import override_settings

from composition.outbox import publish
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.pauses import Pause
from composition.queues import pause_queue
from composition.queues.models import QueueBucket
from composition.testing import wait_until
from tests.browser import artifacts_dir, chrome, log_in_to_admin, wait_for
from tests.jobsapp import jobs
from tests.jobsapp.models import Effect

pytestmark = [pytest.mark.slow, pytest.mark.empty_queues(jobs.CHART_QUEUE, jobs.PAUSE_QUEUE, RELAY_QUEUE_NAME)]

HISTORY = {"METRICS_SAMPLE_INTERVAL_S": 0.5, "QUEUE_HISTORY_BUCKET_S": 2.0}


def _series(driver: Any, queue: str, name: str) -> list[float | None]:
    from selenium.webdriver.common.by import By

    chart = driver.find_element(By.CSS_SELECTOR, f'svg.ops-chart[data-queue="{queue}"]')
    return [float(value) if value else None for value in chart.get_attribute(f"data-{name}").split(",")]


@pytest.mark.django_db(transaction=True)
def test_the_charts_mark_a_pause_and_show_a_queue_draining(live_server: Any, worker_processes: Any) -> None:
    from selenium.webdriver.common.by import By

    Pause.objects.filter(kind=Pause.QUEUE).delete()
    QueueBucket.objects.all().delete()
    pause_queue(jobs.PAUSE_QUEUE, by="operator", reason="provider outage")
    worker = worker_processes.spawn(
        ["--threads", "2", "--queues", f"{jobs.CHART_QUEUE},{jobs.PAUSE_QUEUE},{RELAY_QUEUE_NAME}"],
        COMPOSITION_TEST_OVERRIDES=json.dumps(HISTORY))
    run = uuid.uuid4().hex[:8]
    with transaction.atomic():
        for index in range(5):
            publish("pause_effect", {"key": f"{run}-held-{index}", "hold_s": 0.0})
        # Two threads at 0.2 s a job: about 4 s to drain, two buckets and more.
        for index in range(40):
            publish("chart_step", {"key": f"{run}-step-{index}", "hold_s": 0.2})
    wait_until(lambda: Effect.objects.filter(key__startswith=f"{run}-step-").count() == 40, timeout_s=60,
               message=worker.output()[-3000:])
    time.sleep(2.5)  # one more bucket: the drained queue's depth at 0
    assert not Effect.objects.filter(key__startswith=f"{run}-held-").exists()

    User.objects.create_superuser("operator", "ops@example.com", "a long operator password")
    shots = artifacts_dir("operations-charts")
    with override_settings(COMPOSITION={**settings.COMPOSITION, **HISTORY}), chrome(height=1600) as driver:
        log_in_to_admin(driver, live_server.url, "operator", "a long operator password")
        driver.get(f"{live_server.url}/admin/composition/operations/?refresh=off")
        wait_for(driver, "#ops-trends", "over the last 2 minutes")
        driver.execute_script("document.querySelector('#ops-trends').scrollIntoView()")
        driver.save_screenshot(str(shots / "charts.png"))

        def marks(queue: str) -> list[Any]:
            return list(driver.find_elements(By.CSS_SELECTOR, f'svg.ops-chart[data-queue="{queue}"] rect.pause-mark'))

        assert marks(jobs.PAUSE_QUEUE), "the paused queue's chart has no pause mark"
        assert not marks(jobs.CHART_QUEUE)
        held = [value for value in _series(driver, jobs.PAUSE_QUEUE, "depth") if value is not None]
        assert held and held[-1] == 5, held  # waiting, not draining

        depth = [value for value in _series(driver, jobs.CHART_QUEUE, "depth") if value is not None]
        peak = depth.index(max(depth))
        assert max(depth) >= 10 and depth[-1] == 0, depth
        assert all(later <= earlier for earlier, later in zip(depth[peak:], depth[peak + 1:], strict=False)), depth
        processed = [value for value in _series(driver, jobs.CHART_QUEUE, "processed") if value]
        # 40 runs in 2 s buckets, as runs per minute: 30 a minute per run in a bucket.
        assert sum(processed) / 30 == pytest.approx(40, abs=0.5), processed
    assert worker.terminate() == 0, worker.output()[-3000:]
