"""``LimitedStarts`` on a real Redis broker (a private Valkey server) with the limits on the
cache's Redis: a start over a limit is put back as a delayed copy of the message as fetched
(same id, same attempts, one more wait) and skipped, holding no slot; a start within it holds a
slot until its run ends, however it ends; with the limits' Redis unreachable the job waits
instead of running unlimited; Dramatiq's "skipped" warning is not written for a put-back."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from django.conf import settings
from django.test import override_settings
from dramatiq import Message
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import SkipMessage
from structlog.testing import capture_logs

from composition.broker.configured import build_broker
from composition.conf import conf
from composition.jobs.middleware.limited_starts import LIMIT_WAITS_OPTION, UNREACHABLE_DELAY_S, LimitedStarts
from composition.jobs.middleware.quiet_skips import DRAMATIQ_WORKER_LOGGER, quiet_put_backs
from composition.limits import JobLimits, SlotRenewer, held_slots, limit_store
from composition.testing import ThrowawayRedis, free_port
from tests.helpers import unique

QUEUE = "limit_probe"


@pytest.fixture
def broker(throwaway_redis_server: ThrowawayRedis) -> Iterator[tuple[Broker, str]]:
    broker = build_broker(throwaway_redis_server.url, heartbeat_timeout_s=5.0, maintenance_chance=0,
                          socket_timeout_s=0.5, connect_timeout_s=0.5, middleware=[LimitedStarts()])
    actor = unique("limit_probe_")
    dramatiq.actor(lambda: None, broker=broker, actor_name=actor, queue_name=QUEUE,
                   job_limits=JobLimits(concurrency=1))
    yield broker, actor
    broker.client.close()  # type: ignore[attr-defined]


def _fetched(actor: str, **options: Any) -> MessageProxy:
    return MessageProxy(Message(queue_name=QUEUE, actor_name=actor, args=(1,), kwargs={},
                                options={"redis_message_id": "r-1", "retries": 2, **options}))


def _delayed(broker: Any) -> list[dict[str, Any]]:
    return [json.loads(body) for body in broker.client.hvals(f"{broker.namespace}:{QUEUE}.DQ.msgs")]


def test_a_start_over_the_limit_is_put_back_delayed_as_fetched_and_holds_no_slot(broker: Any) -> None:
    broker, actor = broker
    middleware = next(m for m in broker.middleware if isinstance(m, LimitedStarts))
    first = _fetched(actor)
    middleware.before_process_message(broker, first)  # takes the only slot
    assert held_slots.snapshot() == {actor: held_slots.snapshot()[actor]} and held_slots.count() == 1

    second = _fetched(actor, **{LIMIT_WAITS_OPTION: 1})
    with pytest.raises(SkipMessage, match="concurrency limit"):
        middleware.before_process_message(broker, second)
    middleware.after_skip_message(broker, second)
    assert held_slots.count() == 1  # the skip of the second freed nothing of the first's
    [copy] = _delayed(broker)
    assert copy["message_id"] == second.message_id and copy["args"] == [1]
    assert copy["options"]["retries"] == 2 and copy["options"][LIMIT_WAITS_OPTION] == 2
    assert copy["options"]["eta"] > 0 and copy["options"]["redis_message_id"] != "r-1"

    middleware.after_process_message(broker, first, exception=RuntimeError("however the run ends"))
    assert held_slots.count() == 0
    assert limit_store().state(actor, JobLimits(concurrency=1)).slots_held == 0
    third = _fetched(actor)
    middleware.before_process_message(broker, third)  # the slot is free again
    middleware.after_process_message(broker, third)


def test_a_run_ending_while_its_slot_is_renewed_is_not_taken_for_an_expired_slot(
        broker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    broker, actor = broker
    middleware = next(m for m in broker.middleware if isinstance(m, LimitedStarts))
    ending, running = _fetched(actor), _fetched(actor)
    middleware.before_process_message(broker, ending)
    snapshot = held_slots.snapshot

    def run_ends_after_the_snapshot() -> dict[str, list[str]]:
        taken = snapshot()
        middleware.after_process_message(broker, ending)  # frees its slot before the renewal
        return taken

    monkeypatch.setattr(held_slots, "snapshot", run_ends_after_the_snapshot)
    with capture_logs() as logs:
        SlotRenewer().tick()
    assert not [entry for entry in logs if "expired" in entry["event"]]
    assert held_slots.count() == 0

    # A slot that did expire under a running job is still reported.
    monkeypatch.setattr(held_slots, "snapshot", snapshot)
    middleware.before_process_message(broker, running)
    [token] = held_slots.snapshot()[actor]
    limit_store().release(actor, token)  # as its lease running out would
    with capture_logs() as logs:
        SlotRenewer().tick()
    assert [entry["actor"] for entry in logs if "expired" in entry["event"]] == [actor]
    middleware.after_process_message(broker, running)
    assert held_slots.count() == 0


def test_with_the_limits_redis_unreachable_the_job_waits_instead_of_running_unlimited(broker: Any) -> None:
    broker, actor = broker
    middleware = next(m for m in broker.middleware if isinstance(m, LimitedStarts))
    caches = {**settings.CACHES, "default": {**settings.CACHES["default"],
                                             "LOCATION": f"redis://127.0.0.1:{free_port()}/0"}}
    message = _fetched(actor)
    with override_settings(CACHES=caches, COMPOSITION=conf.as_dict()), \
            pytest.raises(SkipMessage, match="unreachable limit"):
        middleware.before_process_message(broker, message)
    [copy] = _delayed(broker)
    assert copy["message_id"] == message.message_id
    assert copy["options"]["eta"] - copy["message_timestamp"] >= UNREACHABLE_DELAY_S * 1000 * 0.9
    assert held_slots.count() == 0


def test_dramatiq_does_not_warn_about_a_put_back_but_still_about_other_skips(
        broker: Any, caplog: pytest.LogCaptureFixture) -> None:
    broker, actor = broker
    quiet_put_backs()
    logger = logging.getLogger(DRAMATIQ_WORKER_LOGGER)
    put_back = _fetched(actor, composition_put_back=True)
    other = _fetched(actor)
    with caplog.at_level(logging.WARNING, logger=DRAMATIQ_WORKER_LOGGER):
        logger.warning("Message %s was skipped.", put_back)
        logger.warning("Message %s was skipped.", other)
    assert [record.args[0] for record in caplog.records] == [other]  # type: ignore[index]
