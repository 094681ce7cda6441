"""``cancel()``: a job no relay has sent is taken back in the caller's transaction and never
relayed; one a relay holds, or sent, is not; a claim under way is waited for."""

from __future__ import annotations

import io
import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.utils import timezone

from composition.broker.configured import configured_broker
from composition.outbox import OutboxMessage, cancel, publish
from composition.outbox.claims import claim, release
from composition.outbox.relay import Relay
from composition.testing import wait_until
from tests.jobsapp.models import Effect
from tests.outboxapp.helpers import enqueued

PROBE = "outboxapp_relay_probe"
QUEUE = "outboxapp_probe"
TWO_HOURS_S = 7200.0

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.empty_queues(QUEUE)]
# Committed rows stay pending for the test to relay (composition.testing.left_to_the_relay).
left_pending = pytest.mark.usefixtures("nudge_only")


def _relayed() -> list[int]:
    Relay(configured_broker()).run_until_idle()
    return [message.kwargs["seq"] for message in enqueued(QUEUE)]


@left_pending
def test_a_cancelled_held_job_is_never_relayed_and_the_others_are() -> None:
    with transaction.atomic():
        first = publish(PROBE, {"seq": 1}, delay_s=TWO_HOURS_S)
        second = publish(PROBE, {"seq": 2}, delay_s=TWO_HOURS_S)
        third = publish(PROBE, {"seq": 3})
    with transaction.atomic():
        assert cancel(first) is True
    assert cancel(first.pk) is False  # once
    OutboxMessage.objects.filter(pk=second.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    assert _relayed() == [2, 3]  # the released row first: its id is older
    assert cancel(second) is False and cancel(third) is False  # sent
    assert not OutboxMessage.objects.filter(pk=first.pk).exists()


def test_a_cancel_that_rolls_back_keeps_the_job() -> None:
    row = publish(PROBE, {"seq": 1}, delay_s=TWO_HOURS_S)
    with pytest.raises(RuntimeError), transaction.atomic():
        assert cancel(row) is True
        raise RuntimeError("the caller's transaction fails")
    assert OutboxMessage.objects.get(pk=row.pk).status == OutboxMessage.Status.HELD


@left_pending
def test_a_job_a_relay_claimed_is_never_cancelled_even_once_its_lease_ran_out_or_it_was_released() -> None:
    leased, released = publish(PROBE, {"seq": 1}), publish(PROBE, {"seq": 2})
    assert [row.id for row in claim(limit=10, lease_s=60.0, relay_id="another-relay")] == [leased.pk, released.pk]
    assert cancel(leased) is False  # that relay may be handing it to the broker now
    # A relay killed after its enqueue leaves its lease to run out; a batch half sent is released
    # whole: either way the message may be on the broker.
    OutboxMessage.objects.filter(pk=leased.pk).update(claimed_until=timezone.now() - timedelta(seconds=1))
    release([released.pk], error="ConnectionError: the second call of the batch failed", relay_id="another-relay")
    assert cancel(leased) is False and cancel(released) is False
    assert OutboxMessage.objects.filter(pk__in=[leased.pk, released.pk]).count() == 2


@left_pending
def test_a_cancel_waits_for_a_claim_under_way_and_then_sees_its_lease() -> None:
    row = publish(PROBE, {"seq": 1})
    claimed, go_on = threading.Event(), threading.Event()

    def relay_claiming() -> None:
        try:
            with transaction.atomic():
                claim(limit=10, lease_s=60.0, relay_id="slow-relay")
                claimed.set()
                go_on.wait(10)  # the claim holds its row lock until this commits
        finally:
            connection.close()

    thread = threading.Thread(target=relay_claiming)
    thread.start()
    try:
        assert claimed.wait(10)
        outcome: list[bool] = []
        canceller = threading.Thread(target=lambda: (outcome.append(cancel(row.pk)), connection.close()))
        canceller.start()
        canceller.join(1.0)
        assert canceller.is_alive(), "the cancel did not wait for the claim's row lock"
        go_on.set()
        canceller.join(10)
        assert outcome == [False]
    finally:
        go_on.set()
        thread.join(10)
    assert OutboxMessage.objects.get(pk=row.pk).claimed_by == "slow-relay"


def test_a_job_published_in_the_transaction_is_held_by_its_send_after_commit_and_sent() -> None:
    with transaction.atomic():
        row = publish(PROBE, {"seq": 1})
        assert cancel(row) is False  # the send after COMMIT would send it all the same
    assert [message.kwargs["seq"] for message in enqueued(QUEUE)] == [1]


@left_pending
def test_cancelling_the_head_of_a_key_lets_the_rest_of_the_key_go_in_order() -> None:
    with transaction.atomic():
        rows = [publish(PROBE, {"seq": seq}, key="account-7") for seq in range(1, 4)]
    assert cancel(rows[0]) is True
    assert _relayed() == [2, 3]


def test_cancel_takes_a_row_or_an_id_and_nothing_else() -> None:
    assert cancel(10**12) is False and cancel(-1) is False  # no such row
    for wrong in ("12", 12.0, True, None, OutboxMessage(actor_name=PROBE, queue_name=QUEUE, payload={})):
        with pytest.raises(TypeError, match="cancel"):
            cancel(wrong)  # type: ignore[arg-type]


@left_pending
def test_the_command_cancels_each_id_and_says_what_became_of_the_others() -> None:
    held = publish(PROBE, {"seq": 1}, delay_s=TWO_HOURS_S)
    sent = publish(PROBE, {"seq": 2})
    _relayed()
    leased, tried = publish(PROBE, {"seq": 3}), publish(PROBE, {"seq": 4})
    claim(limit=10, lease_s=60.0, relay_id="another-relay")
    release([tried.pk], error="ConnectionError", relay_id="another-relay")
    out = io.StringIO()
    with pytest.raises(CommandError, match="4 of 5 not cancelled"):
        call_command("outbox", "cancel", str(held.pk), str(sent.pk), str(leased.pk), str(tried.pk), "999999999999",
                     str(held.pk), stdout=out)
    sent_at = OutboxMessage.objects.get(pk=sent.pk).sent_at.isoformat(timespec="seconds")
    until = OutboxMessage.objects.get(pk=leased.pk).claimed_until.isoformat(timespec="seconds")
    assert out.getvalue().splitlines() == [
        f"{held.pk}: cancelled ({PROBE}, was held)",
        f"{sent.pk}: not cancelled, sent at {sent_at}",
        f"{leased.pk}: not cancelled, a relay is sending it (leased until {until})",
        f"{tried.pk}: not cancelled, a relay tried to send it: it may be on the broker, and a relay sends it again",
        "999999999999: not cancelled, no such outbox row (cancelled already, purged, or sent and pruned)"]
    assert not OutboxMessage.objects.filter(pk=held.pk).exists()

    with pytest.raises(CommandError, match="cancel takes the ids of outbox rows"):
        call_command("outbox", "cancel")
    with pytest.raises(CommandError, match="not an outbox row id: 'x1'"):
        call_command("outbox", "cancel", "x1")
    with pytest.raises(CommandError, match="ids are for cancel only, not status"):
        call_command("outbox", "status", "12")


@pytest.mark.slow
@pytest.mark.empty_queues("jobs_crash", "composition.outbox")
def test_with_short_delays_held_a_real_runworkers_runs_the_job_left_and_never_the_cancelled_one(
        worker_processes: Any, settings: Any) -> None:
    # docs/jobs.md's advice: an OUTBOX_HELD_DELAY_S under the delays to cancel keeps them in the
    # outbox, where cancel() reaches them until due.
    overrides = {"OUTBOX_HELD_DELAY_S": 0.5}
    settings.COMPOSITION = {**settings.COMPOSITION, **overrides}
    worker = worker_processes.spawn(["--threads", "2", "--queues", "jobs_crash,composition.outbox"],
                                    COMPOSITION_TEST_OVERRIDES=json.dumps(overrides))
    wait_until(lambda: '"component": "heartbeat"' in worker.output(), 60, message=worker.output()[-3000:])
    with transaction.atomic():
        kept = publish("crash_effect", {"key": "cancel-kept"}, delay_s=2.0)
        dropped = publish("crash_effect", {"key": "cancel-dropped"}, delay_s=2.0)
    assert cancel(dropped) is True
    wait_until(lambda: Effect.objects.filter(key="cancel-kept").exists(), 30,
               message="the job left did not run:\n" + worker.output()[-3000:])
    time.sleep(2.0)  # two more sweeps
    assert worker.terminate() == 0
    assert sorted(Effect.objects.values_list("key", flat=True)) == ["cancel-kept"]
    assert cancel(kept) is False


@left_pending
def test_cancelling_a_replay_opens_its_dead_letter_again() -> None:
    from composition.jobs.models import DeadLetter
    from composition.jobs.replay import replay
    from tests.jobs.test_deadletters import dead_letter

    letter = dead_letter(key="cancelled-replay")
    replayed = replay(letter.pk)
    assert cancel(replayed.replay_outbox_id) is True
    letter.refresh_from_db()
    assert (letter.status, letter.replay_outbox_id, letter.replayed_at) == (DeadLetter.Status.DEAD, None, None)
    again = replay(letter.pk)  # replayable as before, its ledger key kept
    assert OutboxMessage.objects.get(pk=again.replay_outbox_id).headers["idempotency_key"] == letter.message_id
