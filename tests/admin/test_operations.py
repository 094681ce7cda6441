"""The operations page in the admin: who may see it, that its numbers are the database's and the
broker's, and that its cost does not grow with the tables."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.template.defaultfilters import floatformat
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from dramatiq import Message

from composition.broker.configured import configured_broker
from composition.health import heartbeats
from composition.jobs.deadletters import fingerprint
from composition.jobs.middleware.in_flight import RUNS_WINDOW_S
from composition.jobs.models import DeadLetter
from composition.outbox import OutboxMessage, publish
from composition.outbox.relay import RELAY_QUEUE_NAME
from tests.helpers import staff_client, table_row
from tests.jobsapp import jobs

URL = "/admin/composition/operations/"
DASH = "\N{EN DASH}"  # the page's "nothing to show"


def bulk_dead_letters(count: int, *, groups: int = 3, actor: str = "charge") -> None:
    """``count`` open dead letters spread over ``groups`` failure groups, written in bulk."""
    now = timezone.now()
    rows = []
    for index in range(count):
        # Letters, not digits: the fingerprint reads digits as variable parts of one message.
        group = "abcdefghij"[index % groups]
        error_class, message = "builtins.LookupError", f"no account in group {group}"
        rows.append(DeadLetter(
            actor=actor, queue=jobs.CHECK_QUEUE, message_id=f"bulk-{index}",
            payload={"account": "acme", "key": f"bulk-{index}"},
            attempts=1, error_class=error_class, error_message=message,
            fingerprint=fingerprint(actor, error_class, message),
            first_failed_at=now - timedelta(seconds=index), last_failed_at=now - timedelta(seconds=index)))
    DeadLetter.objects.bulk_create(rows, batch_size=2000)


# -- who may see it --------------------------------------------------------------------------------
@pytest.mark.django_db
def test_anonymous_callers_are_sent_to_the_login_page() -> None:
    response = Client().get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


@pytest.mark.django_db
def test_staff_need_the_view_permission() -> None:
    assert staff_client(username="no-perm").get(URL).status_code == 403
    allowed = staff_client("view_operations", username="viewer")
    page = allowed.get(URL)
    assert page.status_code == 200
    assert b'id="ops-queues"' in page.content
    assert b'http-equiv="refresh"' in page.content, "it refreshes itself, without JavaScript"
    assert b'http-equiv="refresh"' not in allowed.get(URL + "?refresh=off").content


@pytest.mark.django_db
def test_the_page_shows_no_dead_letter_to_who_may_not_see_them() -> None:
    """Operations is a proxy of DeadLetter: none of ModelAdmin's per-row pages may answer under it."""
    bulk_dead_letters(1)
    letter = DeadLetter.objects.get()
    viewer = staff_client("view_operations", username="ops-only")
    assert viewer.get("/admin/composition/deadletter/").status_code == 403
    for row_page in (f"{letter.pk}/change/", f"{letter.pk}/history/", f"{letter.pk}/delete/", f"{letter.pk}/",
                     "add/"):
        response = viewer.get(URL + row_page)
        assert response.status_code == 404, (row_page, response.status_code)
        assert letter.message_id.encode() not in response.content
    page = viewer.get(URL)
    assert page.status_code == 200
    # The failure groups' counts, not their text (it may quote a payload), nor links answering 403.
    html = page.content.decode()
    assert 'class="num group-count">1<' in html
    assert "no account in group" not in html and "/admin/composition/deadletter/" not in html
    reader = staff_client("view_operations", "view_deadletter", username="ops-and-letters").get(URL).content.decode()
    assert "no account in group a" in reader and "/admin/composition/deadletter/?fingerprint=" in reader


@pytest.mark.django_db
def test_unreadable_heartbeats_are_unknown_not_no_workers() -> None:
    from composition.conf import conf
    from composition.testing import free_port

    caches = {**settings.CACHES, "default": {**settings.CACHES["default"],
                                             "LOCATION": f"redis://127.0.0.1:{free_port()}/0"}}
    with override_settings(CACHES=caches, COMPOSITION=conf.as_dict()):
        page = staff_client("view_operations", username="ops-night").get(URL + "?refresh=off").content.decode()
    assert "Heartbeats unavailable" in page
    count = page[page.index('id="ops-workers-count"'):]
    assert count[:count.index("</div>")].count("heartbeats unavailable") == 1
    assert "No worker process is beating" not in page
    assert "the heartbeats could not be read" in page


@pytest.mark.django_db
def test_the_admin_index_links_to_it(admin_client: Client) -> None:
    assert URL.encode() in admin_client.get("/admin/").content


# -- its numbers -----------------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.empty_queues(jobs.CHECK_QUEUE, RELAY_QUEUE_NAME)
@pytest.mark.usefixtures("nudge_only")
def test_queue_and_dead_letter_figures_are_the_database_and_the_brokers(admin_client: Client) -> None:
    for seq in range(4):
        publish(jobs.charge, {"account": "a", "key": f"pending-{seq}"})  # nudge only: they stay pending
    OutboxMessage.objects.filter(actor_name="charge").update(created_at=timezone.now() - timedelta(seconds=42))
    broker = configured_broker()
    for seq in range(3):  # straight on the broker: ready messages no outbox row accounts for
        broker.enqueue(Message(queue_name=jobs.CHECK_QUEUE, actor_name="charge", args=(),
                               kwargs={"account": "a", "key": f"ready-{seq}"}, options={}))
    broker.enqueue(Message(queue_name=jobs.CHECK_QUEUE, actor_name="charge", args=(),
                           kwargs={"account": "a", "key": "later"}, options={}), delay=60_000)
    bulk_dead_letters(7, groups=2)

    page = admin_client.get(URL)
    snapshot = page.context["snapshot"]
    queue = next(row for row in snapshot.queues if row.name == jobs.CHECK_QUEUE)
    assert (queue.outbox_pending, queue.broker.ready, queue.broker.delayed) == (4, 3, 1)
    assert queue.depth == 8
    assert 41 <= queue.oldest_pending_age_s < 60
    assert queue.broker_oldest_age_s is not None and 0 <= queue.broker_oldest_age_s < 30  # Redis: measured
    assert snapshot.open_dead_letters == DeadLetter.objects.filter(status="dead").count() == 7
    assert sorted(group["count"] for group in snapshot.failure_groups) == [3, 4]
    html = page.content.decode()
    assert f'data-queue="{jobs.CHECK_QUEUE}"' in html
    # An empty queue's waits are a dash, not "0.0 s" as if something had just arrived.
    empty = table_row(html, "data-queue", jobs.NOOP_QUEUE)
    assert "0.0 s" not in empty and empty.count("\N{EN DASH}") >= 2, empty
    for group in snapshot.failure_groups:
        assert f"?fingerprint={group['fingerprint']}" in html, "each group links to its filtered list"
    # Two groups of one actor and error class are told apart by their message.
    assert "no account in group a" in html and "no account in group b" in html
    assert snapshot.failure_group_count == 2 and "largest of" not in html


@pytest.mark.django_db
def test_more_groups_than_shown_are_counted_and_only_replayers_see_replay_buttons(admin_client: Client) -> None:
    from composition.operations.snapshot import FAILURE_GROUPS_SHOWN

    now = timezone.now()
    DeadLetter.objects.bulk_create([
        DeadLetter(actor="charge", queue=jobs.CHECK_QUEUE, message_id=f"group-{index}", payload={}, attempts=1,
                   error_class="builtins.LookupError", error_message=f"cause {index}",
                   fingerprint=f"{index:032x}", first_failed_at=now, last_failed_at=now)
        for index in range(FAILURE_GROUPS_SHOWN + 5)])
    page = admin_client.get(URL)
    assert page.context["snapshot"].failure_group_count == FAILURE_GROUPS_SHOWN + 5
    assert f"The {FAILURE_GROUPS_SHOWN} largest of {FAILURE_GROUPS_SHOWN + 5} groups" in " ".join(
        page.content.decode().split())
    assert page.content.count(b"Replay group") == FAILURE_GROUPS_SHOWN
    viewer = staff_client("view_operations", username="ops-viewer").get(URL)
    assert viewer.status_code == 200 and b"Replay group" not in viewer.content


def _row(html: str, attribute: str, value: str) -> str:
    """The text of the page's table row whose ``attribute`` is ``value``, tags stripped."""
    return " ".join(re.sub(r"<[^>]+>", " ", table_row(html, attribute, value)).split())


def _outbox_rows(queue: str, *, pending_age_s: float, pending: int, sent_ago_s: list[float]) -> None:
    now = timezone.now()
    rows = [OutboxMessage(actor_name="charge", queue_name=queue, payload={},
                          created_at=now - timedelta(seconds=pending_age_s)) for _ in range(pending)]
    rows += [OutboxMessage(actor_name="charge", queue_name=queue, payload={}, status=OutboxMessage.Status.SENT,
                           created_at=now - timedelta(seconds=ago + 1), sent_at=now - timedelta(seconds=ago))
             for ago in sent_ago_s]
    OutboxMessage.objects.bulk_create(rows)


@contextmanager
def _heartbeats() -> Iterator[Callable[[str, dict[str, Any]], None]]:
    """A writer of real heartbeats (``composition.health.heartbeats``, into the cache's Redis, as a
    worker writes them), each withdrawn at the end."""
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    written: list[str] = []

    def write(worker: str, state: dict[str, Any]) -> None:
        written.append(worker)
        heartbeats.write_heartbeat(client, worker, state)

    try:
        yield write
    finally:
        for worker in written:
            heartbeats.clear_heartbeat(client, worker)
        client.close()


@pytest.mark.django_db
def test_rates_and_relay_lag_are_the_outbox_rows_and_the_heartbeats_runs(admin_client: Client) -> None:
    tag = uuid.uuid4().hex[:8]
    busy, behind = f"ops-busy-{tag}", f"ops-behind-{tag}"
    # busy: 3 rows pending for 42 s, 10 relayed within the window, 4 before it.
    _outbox_rows(busy, pending_age_s=42, pending=3, sent_ago_s=[60] * 10 + [RUNS_WINDOW_S + 600] * 4)
    # behind: 2 rows pending for 100 s, the oldest backlog of all.
    _outbox_rows(behind, pending_age_s=100, pending=2, sent_ago_s=[])
    with _heartbeats() as beat:
        # Two workers' beats: 30 and 15 runs of busy's jobs over the heartbeats' window.
        for pid, runs in ((1, 30), (2, 15)):
            beat(f"ops-{tag}:{pid}", {"jobs_in_flight": 0, "runs_by_queue": {busy: runs}})
        page = admin_client.get(URL + "?refresh=off")
    snapshot = page.context["snapshot"]
    rows = {row.name: row for row in snapshot.queues}
    assert rows[busy].enqueued_per_min == 10 * 60 / snapshot.window_s == 2.0  # the 4 older ones are not counted
    assert rows[busy].processed_per_min == (30 + 15) * 60 / RUNS_WINDOW_S == 9.0
    assert rows[behind].enqueued_per_min == 0 and rows[behind].processed_per_min == 0
    assert (rows[busy].outbox_pending, rows[behind].outbox_pending, snapshot.outbox_pending) == (3, 2, 5)
    # The relay lag is the oldest pending row of any queue: behind's, not busy's, not a sum.
    assert 100 <= snapshot.relay_lag_s < 110
    html = page.content.decode()
    assert _row(html, "data-queue", busy).endswith(" 2.0 9.0 running")  # enqueued / min, processed / min
    assert _row(html, "data-queue", behind).endswith(" 0.0 0.0 running")
    lag = re.search(r'id="ops-relay-lag"><strong[^>]*>([^<]*)</strong>', html)
    assert lag and lag.group(1) == f"{floatformat(snapshot.relay_lag_s, 1)} s"

    # `outbox status` reports the same backlog per queue (and its totals), from the same function.
    out = StringIO()
    call_command("outbox", "status", "--json", stdout=out)
    status = json.loads(out.getvalue())
    assert status["window_s"] == snapshot.window_s
    for name in (busy, behind):
        queue = status["queues"][name]
        assert (queue["pending"], queue["relayed_recently"] * 60 / status["window_s"]) == \
            (rows[name].outbox_pending, rows[name].enqueued_per_min)
        assert queue["oldest_pending_age_s"] == pytest.approx(rows[name].oldest_pending_age_s, abs=2)
    assert status["pending"] == snapshot.outbox_pending == 5
    assert status["oldest_pending_age_s"] == pytest.approx(snapshot.relay_lag_s, abs=2)


def _running(jobs_started_ago_s: list[float], max_job_s: float | None) -> dict[str, Any]:
    """A heartbeat's jobs fields (as ``InFlightRegistry.state()`` writes them), oldest first."""
    now = time.time()
    jobs = [{"job_id": f"job-{index}", "actor": "charge", "attempt": index + 1, "started_at": now - ago}
            for index, ago in enumerate(sorted(jobs_started_ago_s, reverse=True))]
    return {"jobs_in_flight": len(jobs), "oldest_job_started_at": jobs[0]["started_at"] if jobs else None,
            "max_job_s": max_job_s, "jobs": jobs}


@pytest.mark.django_db
def test_with_nothing_pending_the_relay_lag_reads_a_dash(admin_client: Client) -> None:
    html = admin_client.get(URL + "?refresh=off").content.decode()
    lag = re.search(r'id="ops-relay-lag"><strong[^>]*>([^<]*)</strong>', html)
    assert lag and lag.group(1) == "\N{EN DASH}"


@pytest.mark.django_db
def test_a_workers_row_is_its_heartbeat_with_stuck_and_stale_ones_marked(admin_client: Client) -> None:
    tag = uuid.uuid4().hex[:8]
    healthy, stuck, gone = (f"ops-{tag}:{pid}" for pid in (101, 102, 103))
    with override_settings(COMPOSITION={**settings.COMPOSITION, "WORKER_STALE_AFTER_S": 3.0,
                                        "WORKER_STUCK_AFTER_S": 600.0}), _heartbeats() as beat:
        beat(gone, _running([], None))
        time.sleep(3.2)  # gone's beat turns stale: it stopped beating without withdrawing
        # healthy: two jobs, the oldest 20 s into a 120 s limit; stuck: 200 s into a 60 s limit.
        beat(healthy, {**_running([20, 5], 120), "breakers": {"email": "open"}})
        beat(stuck, _running([200], 60))
        time.sleep(0.5)  # the beats' age, as the page reads it
        page = admin_client.get(URL + "?refresh=off")
    snapshot = page.context["snapshot"]
    rows = {row.worker: row for row in snapshot.workers}
    assert 0.5 <= rows[healthy].beat_age_s < 3 and 0.5 <= rows[stuck].beat_age_s < 3
    assert (rows[healthy].jobs_in_flight, rows[stuck].jobs_in_flight) == (2, 1)
    assert rows[healthy].oldest_job is not None and rows[healthy].oldest_job["attempt"] == 1  # the 20 s one
    assert 20 <= rows[healthy].oldest_job_age_s < 23  # type: ignore[operator]
    assert 200 <= rows[stuck].oldest_job_age_s < 203  # type: ignore[operator]
    assert (rows[healthy].stuck, rows[stuck].stuck) == (False, True)
    assert rows[healthy].breakers == {"email": "open"}
    assert gone not in rows
    (stale,) = [row for row in snapshot.stale_workers if row["worker"] == gone]
    assert 3.2 <= stale["age_s"] < 6

    html = page.content.decode()
    for worker, state in ((healthy, "beating"), (stuck, "stuck")):
        row = rows[worker]
        assert _row(html, "data-worker", worker) == (
            f"{worker} {floatformat(row.beat_age_s, 1)} s {row.jobs_in_flight} charge (attempt 1), "
            f"{floatformat(row.oldest_job_age_s, 1)} s {state} {DASH}")  # sees no paused queue
    assert _row(html, "data-worker", gone) == \
        f"{gone} {floatformat(stale['age_s'], 1)} s {DASH} {DASH} stale: no heartbeat {DASH}"
    assert re.search(rf"<td>{re.escape(healthy)}</td><td>email</td><td class=\"ops-bad\">open</td>", html)


# -- its cost --------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_query_count_does_not_grow_with_the_dead_letters(admin_client: Client) -> None:
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(URL).status_code == 200
        return len(captured)

    bulk_dead_letters(10, groups=3)
    few = queries()
    DeadLetter.objects.all().delete()
    bulk_dead_letters(10_000, groups=3)
    assert queries() == few


def test_a_loss_of_the_broker_s_data_shows_with_the_jobs_it_sent_again(admin_client: Client) -> None:
    from composition.jobs.models import BrokerEpoch

    assert b'id="ops-broker-loss"' not in admin_client.get(URL).content
    BrokerEpoch.objects.create(token=uuid.uuid4().hex)  # the first epoch: no loss
    BrokerEpoch.objects.create(token=uuid.uuid4().hex, lost=True, resent=12,
                               began_at=timezone.now() - timedelta(minutes=5),
                               cause="queue jobs_crash: 3 messages on the broker for 15 sent, unfinished jobs")
    page = admin_client.get(URL)
    assert page.context["snapshot"].broker_loss["resent"] == 12
    shown = re.sub(r"\s+", " ", page.content.decode())
    assert re.search(r'id="ops-broker-loss"><strong class="ops-bad">12</strong>jobs sent again: the broker lost its '
                     r"data 5 minutes ago \(queue jobs_crash: 3 messages on the broker for 15 sent, unfinished "
                     r"jobs\), still reconciling", shown), shown[:200]
