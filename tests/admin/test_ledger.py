"""The inbox ledger's admin page: read-only, found by message id, and no full count of a table
that holds a row per job run."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from composition.jobs.models import ProcessedMessage

URL = "/admin/composition/processedmessage/"


def _rows() -> tuple[ProcessedMessage, ProcessedMessage]:
    task_run = ProcessedMessage.objects.create(message_id=str(uuid.uuid4()), actor="tasks_default_q")
    job_run = ProcessedMessage.objects.create(message_id=str(uuid.uuid4()), actor="send_payment_receipt",
                                              processed_at=timezone.now())
    return task_run, job_run


@pytest.mark.django_db
def test_a_message_is_found_by_its_id_and_shown_read_only(admin_client: Client) -> None:
    task_run, job_run = _rows()
    found = admin_client.get(URL, {"q": task_run.message_id}).content.decode()
    assert task_run.message_id in found and job_run.message_id not in found
    detail = admin_client.get(f"{URL}{task_run.pk}/change/").content.decode()
    assert "tasks_default_q" in detail and 'name="_save"' not in detail  # read-only
    assert admin_client.get(f"{URL}add/").status_code == 403


@pytest.mark.django_db
def test_the_unfiltered_list_counts_by_the_planner_s_estimate_not_a_scan(admin_client: Client) -> None:
    _rows()
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {ProcessedMessage._meta.db_table}")
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(URL)
    assert page.status_code == 200
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and "processedmessage" in q["sql"]]
    assert counts == [], counts
    assert any("reltuples" in q["sql"] for q in queries)
