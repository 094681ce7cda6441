"""The ``django.tasks`` results' admin page: read-only, found by result id, with what a caller's
``get_result`` would show (arguments, attempts, errors, return value)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from composition.jobs.models import TaskRecord

URL = "/admin/composition/taskrecord/"


@pytest.mark.django_db
def test_a_result_is_found_by_its_id_and_shown_read_only(admin_client: Client) -> None:
    now = timezone.now()
    failed = TaskRecord.objects.create(
        backend="default", queue_name="q", task_path="billing.tasks.charge", args=[41], kwargs={"currency": "EUR"},
        status=TaskRecord.Status.FAILED, started_at=now, finished_at=now, worker_ids=["host:1", "host:2"],
        errors=[{"exception_class_path": "builtins.ValueError", "traceback": "ValueError: card <declined>"}])
    done = TaskRecord.objects.create(backend="default", queue_name="q", task_path="billing.tasks.refund",
                                     status=TaskRecord.Status.SUCCESSFUL, return_value={"refunded": 12})
    found = admin_client.get(URL, {"q": str(failed.pk)}).content.decode()
    assert str(failed.pk) in found and str(done.pk) not in found
    detail = admin_client.get(f"{URL}{failed.pk}/change/").content.decode()
    assert "host:1, host:2" in detail and "builtins.ValueError" in detail and "&quot;EUR&quot;" in detail
    assert "card &lt;declined&gt;" in detail  # escaped
    assert 'name="_save"' not in detail  # read-only
    assert "&quot;refunded&quot;: 12" in admin_client.get(f"{URL}{done.pk}/change/").content.decode()
    assert admin_client.get(f"{URL}add/").status_code == 403
    assert admin_client.get(URL, {"status__exact": "FAILED"}).status_code == 200
