"""The ``django.tasks`` results in the admin, in headless Chromium, as a real worker left them: a
success with its return value and a failure with its traceback, each found by the result id a
caller holds; the screenshots are saved."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

if not (importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks")):
    pytest.skip("neither django.tasks (Django 6) nor the django-tasks backport is installed",
                allow_module_level=True)

from django.contrib.auth.models import User

from composition.tasks._compat import TaskResultStatus
from composition.testing import wait_until
from tests.browser import artifacts_dir, chrome, log_in_to_admin, wait_for
from tests.jobsapp import tasks

pytestmark = [pytest.mark.slow, pytest.mark.empty_queues(tasks.QUEUE)]


@pytest.mark.django_db(transaction=True)
def test_an_operator_finds_a_result_by_its_id_and_reads_what_became_of_it(live_server: Any,
                                                                          worker_processes: Any) -> None:
    returned = tasks.returns.enqueue("shown")
    failed = tasks.refuses.enqueue("shown-failure")
    worker = worker_processes.spawn(["--threads", "2", "--queues", tasks.QUEUE])
    wait_until(lambda: tasks.returns.get_result(returned.id).status == TaskResultStatus.SUCCESSFUL
               and tasks.refuses.get_result(failed.id).status == TaskResultStatus.FAILED, timeout_s=60,
               message=f"tasks did not finish; worker log:\n{worker.output()[-3000:]}")
    assert worker.terminate() == 0

    User.objects.create_superuser("operator", "ops@example.com", "a long operator password")
    shots = artifacts_dir("task-results")
    with chrome(height=1400) as driver:
        log_in_to_admin(driver, live_server.url, "operator", "a long operator password")
        driver.get(f"{live_server.url}/admin/composition/taskrecord/?q={returned.id}")
        row = wait_for(driver, "#result_list tbody tr", returned.id)
        assert "tests.jobsapp.tasks.returns" in row.text and "Successful" in row.text, row.text
        assert failed.id not in driver.page_source
        driver.save_screenshot(str(shots / "search.png"))

        driver.get(f"{live_server.url}/admin/composition/taskrecord/{returned.id}/change/")
        wait_for(driver, ".field-pretty_return_value", '"key": "shown"')
        driver.save_screenshot(str(shots / "success.png"))

        driver.get(f"{live_server.url}/admin/composition/taskrecord/{failed.id}/change/")
        errors = wait_for(driver, ".field-pretty_errors", "composition.errors.PermanentError")
        assert "shown-failure" in errors.text  # the traceback names the refused key
        assert "Save" not in driver.find_element("css selector", "#content").text  # read-only
        driver.save_screenshot(str(shots / "failure.png"))
