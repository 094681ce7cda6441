"""``RunSignals`` signals the runs of the messages published to be followed, and only those; the
outcome it reports is the one the retry middleware decided."""

from __future__ import annotations

from typing import Any

from dramatiq import Message
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Shutdown

from composition.broker.configured import configured_broker
from composition.jobs.middleware.run_signals import FOLLOW_RUNS_HEADER, RunSignals, job_run_ended, job_run_started


def _message(**headers: Any) -> MessageProxy:
    return MessageProxy(Message(queue_name="default", actor_name="x", args=(), kwargs={},
                                options={"composition": headers}))


def test_only_followed_messages_are_signalled_with_their_outcome() -> None:
    seen: list[tuple[str, str]] = []

    def started(sender: Any, *, message: MessageProxy, **_: Any) -> None:
        seen.append(("started", message.message_id))

    def ended(sender: Any, *, message: MessageProxy, outcome: str, **_: Any) -> None:
        seen.append((outcome, message.message_id))

    job_run_started.connect(started)
    job_run_ended.connect(ended)
    try:
        broker, middleware = configured_broker(), RunSignals()
        plain, followed = _message(), _message(**{FOLLOW_RUNS_HEADER: True})
        for message in (plain, followed):
            middleware.before_process_message(broker, message)
            middleware.after_process_message(broker, message, result=None)
        middleware.after_process_message(broker, followed, exception=ValueError("again"))
        middleware.after_process_message(broker, followed, exception=Shutdown())
        followed.fail()
        middleware.after_process_message(broker, followed, exception=ValueError("for good"))
    finally:
        job_run_started.disconnect(started)
        job_run_ended.disconnect(ended)
    assert seen == [("started", followed.message_id), ("success", followed.message_id),
                    ("retry", followed.message_id), ("retry", followed.message_id), ("dead", followed.message_id)]
