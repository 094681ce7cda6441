"""``manage.py jobs check-compat`` against the test database: queued work that the running code
would refuse is reported per job and problem with its count and an example id, grouped by shape
(one bind per distinct shape), and the command exits 1; work that fits is not reported, and with
none of the other kind it exits 0."""

from __future__ import annotations

import io
import json
import uuid

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from composition.broker.configured import configured_broker
from composition.jobs.compatibility import GONE, queued_problems
from composition.jobs.models import DeadLetter
from composition.outbox.models import OutboxMessage
from tests.jobsapp import jobs

pytestmark = pytest.mark.django_db


def _pending(actor: str, payload: dict[str, object], count: int = 1) -> list[int]:
    rows = OutboxMessage.objects.bulk_create(OutboxMessage(actor_name=actor, queue_name=jobs.PAUSE_QUEUE,
                                                            payload=payload) for _ in range(count))
    return [row.pk for row in rows]


def _dead_letter(actor: str, args: list[object], payload: dict[str, object], *,
                 status: str = DeadLetter.Status.DEAD) -> int:
    now = timezone.now()
    return DeadLetter.objects.create(actor=actor, queue=jobs.PAUSE_QUEUE, message_id=uuid.uuid4().hex, args=args,
                                     payload=payload, attempts=1, error_class="PermanentError", fingerprint="f",
                                     first_failed_at=now, last_failed_at=now, status=status).pk


def _check(*extra: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("jobs", "check-compat", *extra, stdout=out)
    except SystemExit as exit_:
        return int(exit_.code or 0), out.getvalue()
    return 0, out.getvalue()


def test_work_the_running_code_would_refuse_is_counted_per_job_and_problem_and_exits_1() -> None:
    _pending("pause_effect", {"key": "fits", "hold_s": 1.0}, count=3)
    _pending("pause_effect", {"hold_s": 1.5, "key": "fits in another order"})
    missing = _pending("pause_effect", {"key": "no hold"}, count=2)
    unexpected = _pending("pause_effect", {"key": "x", "hold_s": 1.0, "colour": "red"}, count=4)
    wrong_type = _pending("pause_effect", {"key": 5, "hold_s": 1.0})
    gone = _pending("a_job_since_removed", {"invoice_id": 1}, count=2)
    dead_gone = _dead_letter("a_job_since_removed", [], {"invoice_id": 2})
    _dead_letter("a_job_since_removed", [], {"invoice_id": 3}, status=DeadLetter.Status.REPLAYED)
    _dead_letter("pause_effect", ["positional", 2.0], {})  # positional arguments that fit

    with CaptureQueriesContext(connection) as queries:
        problems = queued_problems(configured_broker())
    # Two grouped queries, then one row per distinct shape (5 outbox shapes, 2 dead-letter ones).
    assert len(queries) == 2 + 5 + 2, [query["sql"][:80] for query in queries]
    found = {(p.source, p.actor, p.count, p.example_id): p.reason for p in problems}
    assert set(found) == {("outbox", "pause_effect", 4, unexpected[0]), ("outbox", "pause_effect", 2, missing[0]),
                          ("outbox", "a_job_since_removed", 2, gone[0]), ("outbox", "pause_effect", 1, wrong_type[0]),
                          ("dead letters", "a_job_since_removed", 1, dead_gone)}
    assert "unexpected keyword argument 'colour'" in found[("outbox", "pause_effect", 4, unexpected[0])]
    assert "missing a required argument 'hold_s'" in found[("outbox", "pause_effect", 2, missing[0])]
    assert "argument 'key' must be str, got int" in found[("outbox", "pause_effect", 1, wrong_type[0])]
    assert found[("outbox", "a_job_since_removed", 2, gone[0])] == GONE

    code, out = _check()
    assert code == 1
    assert f"outbox: 4 of pause_effect (e.g. id {unexpected[0]}): " in out
    assert f"dead letters: 1 of a_job_since_removed (e.g. id {dead_gone}): {GONE}" in out
    code, out = _check("--json")
    assert code == 1 and len(json.loads(out)["problems"]) == 5


def test_with_only_work_that_fits_it_says_so_and_exits_0() -> None:
    _pending("pause_effect", {"key": "fits", "hold_s": 1.0}, count=2)
    _pending("pause_effect", {"key": "sent already", "hold_s": "not a number"})
    OutboxMessage.objects.filter(payload__key="sent already").update(status=OutboxMessage.Status.SENT)
    assert _check() == (0, "every pending outbox row and open dead letter fits the running code\n")
