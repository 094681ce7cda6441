"""The inbox ledger's admin page: read-only, found by message id, and no full count of a table
that holds a row per job run."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from composition.admin.ledger import EstimatedCountPaginator
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
    assert any("reltuples" in q["sql"] for q in queries)
    # A small estimate is checked by a count that stops: never a scan of every row.
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and "processedmessage" in q["sql"]]
    assert counts and all(f"LIMIT {EstimatedCountPaginator.EXACT_UP_TO + 1}" in sql for sql in counts), counts


@pytest.mark.django_db
def test_a_stale_estimate_still_gives_pages(admin_client: Client) -> None:
    """Analysed at one row, grown since: the list still shows one page's rows, and the true count."""
    _rows()
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {ProcessedMessage._meta.db_table}")
    ProcessedMessage.objects.bulk_create(
        ProcessedMessage(message_id=f"grown-{index}", actor="send_payment_receipt") for index in range(120))
    page = admin_client.get(URL)
    assert page.status_code == 200
    assert len(page.context["cl"].result_list) == 50
    assert page.context["cl"].result_count == 122
