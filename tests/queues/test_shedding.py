"""The shedding controller round by round, on the real broker and database: the signals it reads,
when it sheds and resumes, how an operator's pause or resume wins, what admission says while a
queue is shed, and the settings it refuses."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from dramatiq import Message

from composition.backpressure.admission import Backpressure, _shed, admit
from composition.broker.configured import configured_broker
from composition.checks import check_shedding_settings
from composition.pauses import Pause, pause, resume
from composition.queues import SHEDDING_BY, ShedController, read_pressure
from composition.queues.pressure import SIGNALS
from composition.testing import empty_queues
from composition.testing.metrics import metric_value
from tests.jobsapp import jobs

pytestmark = [pytest.mark.django_db, pytest.mark.empty_queues(jobs.SHED_ESSENTIAL_QUEUE)]

OPTIONAL = jobs.SHED_OPTIONAL_QUEUE
SETTINGS = {"SHED_QUEUES": [OPTIONAL, "reminders"], "SHED_ESSENTIAL_QUEUES": [jobs.SHED_ESSENTIAL_QUEUE],
            "SHED_WHEN": {"oldest_wait_s": None, "ready_messages": 4, "db_latency_ms": None},
            "SHED_RESUME_BELOW": 0.5, "SHED_RESUME_AFTER_S": 0.3}


@pytest.fixture
def shedding() -> Iterator[None]:
    with override_settings(COMPOSITION={**settings.COMPOSITION, **SETTINGS}):
        _shed.clear()
        yield
    _shed.clear()


def _backlog(count: int, *, waited_s: float = 0.0) -> None:
    """``count`` essential messages ready on the broker, nobody consuming them."""
    empty_queues(jobs.SHED_ESSENTIAL_QUEUE)
    broker = configured_broker()
    for index in range(count):
        broker.enqueue(Message(queue_name=jobs.SHED_ESSENTIAL_QUEUE, actor_name="shed_essential", args=(),
                               kwargs={"key": f"k{index}"}, options={},
                               message_timestamp=int((time.time() - waited_s) * 1000)))


def _state(queue: str) -> tuple[bool, bool, str] | None:
    row = Pause.objects.filter(kind=Pause.QUEUE, name=queue).first()
    return None if row is None else (row.paused, row.shed, row.changed_by)


def _calm_rounds(controller: ShedController) -> None:
    controller.tick()
    time.sleep(0.35)
    controller.tick()


def test_the_signals_are_measured_on_the_broker_and_the_database() -> None:
    _backlog(3, waited_s=7.0)
    readings = {reading.signal: reading for reading in read_pressure(
        configured_broker(), [jobs.SHED_ESSENTIAL_QUEUE, jobs.NOOP_QUEUE],
        {"oldest_wait_s": 5.0, "ready_messages": 10, "db_latency_ms": 1000.0})}
    assert 7.0 <= readings["oldest_wait_s"].value < 9.0 and readings["oldest_wait_s"].over  # type: ignore[operator]
    assert readings["oldest_wait_s"].where == jobs.SHED_ESSENTIAL_QUEUE
    assert readings["ready_messages"].value == 3 and not readings["ready_messages"].over
    assert 0 < readings["db_latency_ms"].value < 1000  # type: ignore[operator]
    assert "oldest_wait_s of jobs_shed_essential 7." in readings["oldest_wait_s"].describe()
    # A limit of None turns a signal off.
    assert [r.signal for r in read_pressure(configured_broker(), [jobs.SHED_ESSENTIAL_QUEUE],
                                            {"ready_messages": 10, "oldest_wait_s": None})] == ["ready_messages"]


@pytest.mark.usefixtures("shedding")
def test_over_the_limit_sheds_then_calm_for_long_enough_resumes_and_in_between_nothing_moves() -> None:
    controller = ShedController()
    sheds_before = metric_value("composition_queue_sheds_total", queue=OPTIONAL, signal="ready_messages")
    _backlog(5)
    controller.tick()
    assert _state(OPTIONAL) == (True, True, SHEDDING_BY) and _state("reminders") == (True, True, SHEDDING_BY)
    assert "ready_messages of jobs_shed_essential 5 (limit 4)" in Pause.objects.get(name=OPTIONAL).reason
    assert metric_value("composition_queue_sheds_total", queue=OPTIONAL, signal="ready_messages") == sheds_before + 1
    with pytest.raises(Backpressure) as refused:
        admit(OPTIONAL)
    assert refused.value.shed and refused.value.retry_after_s > 0

    _backlog(3)  # below the limit, not below half of it: held, however long
    _calm_rounds(controller)
    assert _state(OPTIONAL) == (True, True, SHEDDING_BY)
    _backlog(1)  # below half: resumed once calm has lasted SHED_RESUME_AFTER_S
    controller.tick()
    assert _state(OPTIONAL)[0] is True  # type: ignore[index]
    time.sleep(0.35)
    controller.tick()
    assert _state(OPTIONAL) == (False, True, SHEDDING_BY) and _state("reminders") == (False, True, SHEDDING_BY)
    _shed.clear()
    admit(OPTIONAL)


@pytest.mark.usefixtures("shedding")
def test_an_operator_s_pause_is_never_resumed_by_the_controller() -> None:
    controller = ShedController()
    pause(Pause.QUEUE, "reminders", by="ops", reason="mail provider down")
    _backlog(5)
    controller.tick()
    assert _state("reminders") == (True, False, "ops")  # left as the operator set it
    pause(Pause.QUEUE, OPTIONAL, by="ops", reason="keep it off")  # takes the shed pause over
    assert _state(OPTIONAL) == (True, False, "ops")
    _backlog(0)
    _calm_rounds(controller)
    assert _state("reminders") == (True, False, "ops") and _state(OPTIONAL) == (True, False, "ops")
    # And a controller's resume of a queue an operator paused meanwhile is refused in the row lock.
    assert resume(Pause.QUEUE, OPTIONAL, by=SHEDDING_BY, shed=True)[1] is False
    admit("reminders")  # an operator's pause does not refuse publishes: they wait on the broker


@pytest.mark.usefixtures("shedding")
@pytest.mark.parametrize("listed", [[], [OPTIONAL]], ids=["shedding-off", "queue-unlisted"])
def test_a_queue_shed_under_an_earlier_setting_resumes_at_the_next_round(listed: list[str]) -> None:
    _backlog(5)
    ShedController().tick()
    assert _state("reminders") == (True, True, SHEDDING_BY)
    pause(Pause.QUEUE, "exports", by="ops", reason="kept off")
    # A deploy takes "reminders" out of SHED_QUEUES (or turns shedding off) mid-episode.
    with override_settings(COMPOSITION={**settings.COMPOSITION, **SETTINGS, "SHED_QUEUES": listed}):
        ShedController().tick()
    assert _state("reminders") == (False, True, SHEDDING_BY)
    assert "no longer in SHED_QUEUES" in Pause.objects.get(name="reminders").reason
    assert _state("exports") == (True, False, "ops")  # an operator's pause is theirs
    if listed:
        assert _state(OPTIONAL) == (True, True, SHEDDING_BY)  # still listed, still under pressure


@pytest.mark.usefixtures("shedding")
def test_an_essential_queue_an_operator_paused_is_no_pressure() -> None:
    """Its backlog waits on purpose: shedding the others for it would stop work for nothing."""
    controller = ShedController()
    pause(Pause.QUEUE, jobs.SHED_ESSENTIAL_QUEUE, by="ops", reason="provider outage")
    _backlog(5)
    controller.tick()
    assert _state(OPTIONAL) is None and _state("reminders") is None
    resume(Pause.QUEUE, jobs.SHED_ESSENTIAL_QUEUE, by="ops")
    controller.tick()  # resumed, its backlog is pressure again
    assert _state(OPTIONAL) == (True, True, SHEDDING_BY)


@pytest.mark.usefixtures("shedding")
def test_the_time_a_resumed_queue_spent_paused_is_no_pressure() -> None:
    """Its oldest message waited through the pause: on the first round after a resume that wait
    shed the other queues, though nothing was slow."""
    controller = ShedController()
    pause(Pause.QUEUE, jobs.SHED_ESSENTIAL_QUEUE, by="ops", reason="provider outage")
    _backlog(2, waited_s=60)
    resume(Pause.QUEUE, jobs.SHED_ESSENTIAL_QUEUE, by="ops")
    with override_settings(COMPOSITION={**settings.COMPOSITION, **SETTINGS,
                                        "SHED_WHEN": {"oldest_wait_s": 30, "ready_messages": None}}):
        controller.tick()
        assert _state(OPTIONAL) is None
        # Waiting 30 s since the resume is pressure again.
        Pause.objects.filter(kind=Pause.QUEUE, name=jobs.SHED_ESSENTIAL_QUEUE).update(
            changed_at=timezone.now() - timedelta(seconds=31))
        controller.tick()
    assert _state(OPTIONAL) == (True, True, SHEDDING_BY)


@pytest.mark.usefixtures("shedding")
def test_an_operator_s_resume_during_an_episode_holds_until_it_ends() -> None:
    controller = ShedController()
    _backlog(5)
    controller.tick()
    assert _state(OPTIONAL) == (True, True, SHEDDING_BY)
    resume(Pause.QUEUE, OPTIONAL, by="ops", reason="these must go out")
    for _ in range(3):
        controller.tick()
    assert _state(OPTIONAL) == (False, False, "ops")
    _backlog(0)
    _calm_rounds(controller)  # the episode ends
    _backlog(5)  # a new one: shed again
    controller.tick()
    assert _state(OPTIONAL) == (True, True, SHEDDING_BY)


def _check_ids(**composition: Any) -> set[str]:
    with override_settings(COMPOSITION={**settings.COMPOSITION, **composition}):
        return {message.id for message in check_shedding_settings()}


def test_settings_it_cannot_work_with_are_refused_or_warned_about() -> None:
    assert _check_ids() == set()
    assert _check_ids(SHED_RESUME_BELOW=1.5) == {"composition.E131"}
    assert _check_ids(SHED_QUEUES="reminders") == {"composition.E132"}
    assert _check_ids(SHED_QUEUES=["composition.outbox"]) == {"composition.E132"}
    assert _check_ids(SHED_QUEUES=["a"], SHED_ESSENTIAL_QUEUES=["a"]) == {"composition.E132"}
    assert _check_ids(SHED_WHEN={"cpu": 90}) == {"composition.E133"}
    assert _check_ids(SHED_WHEN={"ready_messages": -1}) == {"composition.E133"}
    # The entry at fault is named (it was only "must map signals of [...]").
    with override_settings(COMPOSITION={**settings.COMPOSITION, "SHED_WHEN": {"oldest_wait": 30, "ready_messages": 5}}):
        assert [message.msg for message in check_shedding_settings()] == [
            f"COMPOSITION['SHED_WHEN'] must map signals of {list(SIGNALS)} to positive limits (or None: that signal "
            "off); not 'oldest_wait': 30."]
    assert _check_ids(SHED_INTERVAL_S=0) == {"composition.E130"}
    assert _check_ids(BROKER_URL="amqp://guest:guest@127.0.0.1:5672/%2F",
                      SHED_WHEN={"oldest_wait_s": 30.0}) == {"composition.W134"}
    assert _check_ids(BROKER_URL="amqp://guest:guest@127.0.0.1:5672/%2F",
                      SHED_WHEN={"oldest_wait_s": 30.0, "ready_messages": 100}) == set()
