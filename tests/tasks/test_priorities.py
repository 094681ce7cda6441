"""``django.tasks`` priorities through the outbox and a real worker on Redis: tasks enqueued with
priorities while no worker runs then run highest first, equal ones in the order enqueued; a task's
priority is kept in its result."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

if not (importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks")):
    pytest.skip("neither django.tasks (Django 6) nor the django-tasks backport is installed",
                allow_module_level=True)

from django.db import transaction

from composition.tasks._compat import TaskResultStatus
from composition.testing import wait_until
from tests.jobsapp import tasks
from tests.jobsapp.models import Effect

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.empty_queues(tasks.QUEUE)]

PRIORITIES = [0, 10, -10, 100, 0, 10, -100, 1, -10, 100, 0, 50]


def test_tasks_run_highest_priority_first_and_equal_ones_in_order(worker_processes: Any) -> None:
    with transaction.atomic():
        results = [tasks.add_effect.using(priority=priority).enqueue(f"prio-{n:02d}")
                   for n, priority in enumerate(PRIORITIES)]
    # One thread, so the run order is the fetch order.
    worker = worker_processes.spawn(["--threads", "1", "--queues", tasks.QUEUE])
    wait_until(lambda: Effect.objects.filter(key__startswith="prio-").count() == len(PRIORITIES), timeout_s=60,
               message=f"tasks did not run; worker log:\n{worker.output()[-3000:]}")
    ran = list(Effect.objects.filter(key__startswith="prio-").order_by("pk").values_list("key", flat=True))
    expected = [f"prio-{n:02d}" for n, _ in sorted(enumerate(PRIORITIES), key=lambda item: (-item[1], item[0]))]
    assert ran == expected
    wait_until(lambda: tasks.add_effect.get_result(results[3].id).status == TaskResultStatus.SUCCESSFUL, timeout_s=10)
    assert tasks.add_effect.get_result(results[3].id).task.priority == 100
    assert worker.terminate() == 0
