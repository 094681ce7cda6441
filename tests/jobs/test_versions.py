"""Job versions and aliases, in-process: ``JobVersions.fit`` upgrades and checks what the worker
would call a job with; ``@job(version=, upgrade=, aliases=)`` declares them; publish() and direct
sends carry the version; the worker's broker answers unknown names with a stand-in while the
rest of the process still reads the registry; ``refuse`` waits out the deploy window, then parks."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from dramatiq.broker import MessageProxy
from dramatiq.errors import ActorNotFound
from dramatiq.message import Message
from dramatiq.middleware import CurrentMessage, SkipMessage

from composition.broker.configured import configured_broker
from composition.errors import IncompatibleMessageError, PayloadValidationError
from composition.jobs import job
from composition.jobs.deploy_window import INCOMPATIBLE_SINCE_OPTION, StandInActor, accept_unknown_jobs, refuse
from composition.jobs.middleware.put_backs import put_back
from composition.jobs.models import DeadLetter
from composition.jobs.replay import replay_payload
from composition.jobs.schema import PayloadSchema
from composition.jobs.versions import JobVersions, message_version
from composition.outbox import publish
from composition.outbox.errors import PayloadDoesNotFitError, UnknownActorError
from composition.testing import empty_queues


def _invoice(invoice: int, currency: str, note: str = "") -> None:
    pass


SCHEMA = PayloadSchema.of(_invoice, "invoice_job")


def _rename(payload: dict[str, Any]) -> dict[str, Any]:
    return {"invoice": payload.pop("invoice_id"), **payload}


def _currency(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "currency": "EUR"}


VERSIONS = JobVersions.of(3, {1: _rename, 2: _currency})


def test_a_message_of_an_older_version_runs_every_upgrade_up_to_the_job_s_own() -> None:
    assert VERSIONS.fit(SCHEMA, (), {"invoice_id": 4, "note": "x"}, 1) == ((), {"invoice": 4, "note": "x",
                                                                               "currency": "EUR"})
    assert VERSIONS.fit(SCHEMA, (), {"invoice": 4}, 2) == ((), {"invoice": 4, "currency": "EUR"})
    assert VERSIONS.fit(SCHEMA, (), {"invoice": 4, "currency": "USD"}, 3) == ((), {"invoice": 4, "currency": "USD"})


@pytest.mark.parametrize(("versions", "args", "kwargs", "version", "reason"), [
    (VERSIONS, (), {"invoice": 4, "currency": "USD"}, 4, "published at version 4, newer than this code's 3"),
    (JobVersions.of(3, {2: _currency}), (), {"invoice_id": 4}, 1, "no upgrade from version 1 is declared"),
    (VERSIONS, (4,), {}, 1, "with positional arguments, which upgrades cannot name"),
    (VERSIONS, (), {"invoice": 4}, "2", "job_version is not a positive integer"),
    (VERSIONS, (), {"invoice": 4}, 0, "job_version is not a positive integer"),
    (VERSIONS, (), {"invoice": "4", "currency": "EUR"}, 3, "argument 'invoice' must be int, got str"),
    (VERSIONS, (), {"invoice": 4}, 3, "missing a required argument 'currency'"),
    (JobVersions.of(2, {1: lambda payload: [payload]}), (), {"invoice": 4}, 1, "returned list, not a dict"),
])
def test_what_cannot_be_fitted_is_incompatible_with_its_reason(versions: JobVersions, args: tuple[Any, ...],
                                                              kwargs: dict[str, Any], version: Any,
                                                              reason: str) -> None:
    with pytest.raises(IncompatibleMessageError, match=r"^incompatible with the running code: ") as caught:
        versions.fit(SCHEMA, args, kwargs, version)
    assert reason in caught.value.reason


@pytest.mark.parametrize(("version", "upgrade", "error"), [
    (0, None, "version must be an integer >= 1"),
    (True, None, "version must be an integer >= 1"),
    (2, {2: _currency}, "upgrade keys are the older versions it upgrades from"),
    (2, {"1": _currency}, "upgrade keys are the older versions"),
    (2, {1: "not callable"}, "upgrade\\[1\\] must be a function"),
    # A gap: version-1 messages could never reach version 3.
    (3, {1: _currency}, "there is no upgrade\\[2\\] to take them on to version 3"),
])
def test_versions_that_cannot_work_are_refused_at_declaration(version: Any, upgrade: Any, error: str) -> None:
    with pytest.raises((ValueError, TypeError), match=error):
        JobVersions.of(version, upgrade)


def test_a_message_says_its_version_in_its_headers_else_its_options_else_1() -> None:
    assert message_version({}) == 1
    assert message_version({"composition": {"outbox_id": 1}}) == 1
    assert message_version({"composition": {"job_version": 2}, "job_version": 5}) == 2
    assert message_version({"job_version": 5}) == 5


# -- declared with @job -----------------------------------------------------------------------------
def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def test_an_alias_is_the_same_actor_under_its_old_name_and_an_old_queue_is_declared() -> None:
    broker = configured_broker()
    name, old, older, old_queue = _unique("renamed"), _unique("old"), _unique("older"), _unique("queue")
    actor = job(queue="jobs_check", actor_name=name, aliases={old: "jobs_check", older: old_queue})(_invoice)
    assert broker.actors[old] is actor and broker.actors[older] is actor and broker.get_actor(old) is actor
    assert old_queue in broker.get_declared_queues()
    with pytest.raises(ValueError, match=f"alias {old!r} of job .* is taken"):
        job(queue="jobs_check", actor_name=_unique("another"), aliases=[old])(_invoice)
    with pytest.raises(TypeError, match="aliases must be a list of names"):
        job(queue="jobs_check", aliases="single_string")  # type: ignore[arg-type]


@pytest.mark.django_db
def test_publish_stamps_a_job_s_version_above_1_and_checks_an_older_one_through_its_upgrades() -> None:
    name = _unique("versioned")
    job(queue="jobs_check", actor_name=name, version=2, upgrade={1: _currency})(_invoice)
    plain = job(queue="jobs_check", actor_name=_unique("plain"))(_invoice)
    with transaction.atomic():
        row = publish(name, {"invoice": 1, "currency": "EUR"})
        unversioned = publish(plain, {"invoice": 1, "currency": "EUR"})
    assert row.headers["job_version"] == 2 and "job_version" not in unversioned.headers
    # What a replay of a version-1 dead letter publishes: checked as upgraded.
    from composition.outbox.publish import publish_with_headers

    with transaction.atomic():
        assert publish_with_headers(name, {"invoice": 1}, headers={"job_version": 1}).headers["job_version"] == 1
        with pytest.raises(PayloadDoesNotFitError, match="missing a required argument 'currency'"):
            publish_with_headers(name, {"invoice": 1}, headers={"job_version": 2})
    empty_queues("jobs_check")


def test_a_direct_send_carries_its_job_s_version_once_and_a_re_enqueue_adds_none() -> None:
    versioned = job(queue="jobs_check", actor_name=_unique("sent"), version=3,
                    upgrade={1: _rename, 2: _currency})(_invoice)
    plain = job(queue="jobs_check", actor_name=_unique("plain"))(_invoice)
    assert versioned.message(invoice=1, currency="EUR").options == {"job_version": 3}
    assert versioned.message_with_options(kwargs={}, job_version=1).options == {"job_version": 1}
    assert plain.message(invoice=1, currency="EUR").options == {}
    # What a retry or a move off a delay queue does with a version-1 message (an older deploy's
    # send, before the job had versions): enqueued again, it must stay version 1.
    broker = configured_broker()
    empty_queues("jobs_check")
    old = Message(queue_name="jobs_check", actor_name=versioned.actor_name, args=(), kwargs={"invoice_id": 1},
                  options={})
    broker.enqueue(old)
    broker.enqueue(old, delay=60_000)
    for body in [*broker.client.hvals(f"{broker.namespace}:jobs_check.msgs"),
                 *broker.client.hvals(f"{broker.namespace}:jobs_check.DQ.msgs")]:
        assert message_version(Message.decode(body).options) == 1
    empty_queues("jobs_check")


def _running(message: Message[Any]) -> Any:
    """Run the next call as a worker thread runs ``message``, through Dramatiq's CurrentMessage."""
    proxy = MessageProxy(message)
    CurrentMessage().before_process_message(configured_broker(), proxy)
    return proxy


def test_a_job_called_as_a_function_from_another_job_s_body_fits_its_own_arguments_not_that_message() -> None:
    called: list[dict[str, Any]] = []
    inner = job(queue="jobs_check", actor_name=_unique("inner"), version=2, upgrade={1: _currency})(
        lambda invoice, currency, note="": called.append({"invoice": invoice, "currency": currency}))
    outer = Message(queue_name="jobs_check", actor_name="typed", args=(), kwargs={"invoice_id": 1}, options={})
    _running(outer)
    try:
        inner(invoice=4, currency="USD")  # the outer message is version 1: no upgrade, no refusal
    finally:
        CurrentMessage().after_process_message(configured_broker(), MessageProxy(outer))
    assert called == [{"invoice": 4, "currency": "USD"}]


def test_a_message_that_fits_no_longer_carries_its_deploy_window_into_a_retry() -> None:
    fits = job(queue="jobs_check", actor_name=_unique("fits"))(lambda invoice, currency, note="": None)
    message = Message(queue_name="jobs_check", actor_name=fits.actor_name, args=(),
                      kwargs={"invoice": 1, "currency": "EUR"}, options={INCOMPATIBLE_SINCE_OPTION: 1})
    proxy = _running(message)
    try:
        fits(invoice=1, currency="EUR")
    finally:
        CurrentMessage().after_process_message(configured_broker(), proxy)
    assert INCOMPATIBLE_SINCE_OPTION not in proxy.options


def test_a_replay_does_not_name_an_older_version_s_positional_arguments_by_the_new_signature() -> None:
    name = _unique("positional")
    job(queue="jobs_check", actor_name=name, version=2, upgrade={1: _currency})(_invoice)
    letter = DeadLetter(actor=name, args=[4], payload={}, headers={})
    with pytest.raises(PayloadValidationError, match="version 1 cannot be named by version 2's signature"):
        replay_payload(letter)
    assert replay_payload(DeadLetter(actor=name, args=[4], payload={"currency": "EUR"},
                                     headers={"job_version": 2})) == {"invoice": 4, "currency": "EUR"}


def test_a_worker_s_broker_answers_unknown_names_with_a_stand_in_and_publish_still_refuses_them() -> None:
    broker = configured_broker()
    with pytest.raises(ActorNotFound):
        broker.get_actor("no_such_job_here")
    accept_unknown_jobs(broker)
    try:
        stand_in = broker.get_actor("no_such_job_here")
        assert isinstance(stand_in, StandInActor) and "no_such_job_here" not in broker.actors
        with pytest.raises(UnknownActorError):
            publish("no_such_job_here", {})
        with pytest.raises(IncompatibleMessageError, match="no job named 'no_such_job_here' here"):
            stand_in(invoice=1)  # outside a worker: no message to put back
        with pytest.raises(ActorNotFound):  # what Dramatiq's callbacks would send to
            stand_in.send(invoice=1)
    finally:
        accept_unknown_jobs(broker, False)


# -- the deploy window ------------------------------------------------------------------------------
def _fetched(**options: Any) -> MessageProxy:
    message = Message(queue_name="jobs_check", actor_name="typed", args=(), kwargs={"invoice_id": 1},
                      options=options, message_id=uuid.uuid4().hex)
    return MessageProxy(configured_broker().enqueue(message))


@override_settings(COMPOSITION={"DEPLOY_WINDOW_S": 60})
def test_within_its_window_a_refused_message_goes_back_delayed_carrying_when_it_was_first_refused() -> None:
    empty_queues("jobs_check")
    message = _fetched()
    with pytest.raises(SkipMessage):
        refuse(configured_broker(), message, IncompatibleMessageError("a reason"))
    assert put_back(message)
    copies = [Message.decode(body) for body in configured_broker().client.hvals(
        f"{configured_broker().namespace}:jobs_check.DQ.msgs")]
    assert [copy.message_id for copy in copies] == [message.message_id]
    first = copies[0].options[INCOMPATIBLE_SINCE_OPTION]
    # Back again later: the first refusal's time is kept, so the window does not restart.
    with pytest.raises(SkipMessage):
        refuse(configured_broker(), MessageProxy(copies[0]), IncompatibleMessageError("a reason"))
    again = [Message.decode(body) for body in configured_broker().client.hvals(
        f"{configured_broker().namespace}:jobs_check.DQ.msgs")]
    assert len(again) == 2 and {copy.options[INCOMPATIBLE_SINCE_OPTION] for copy in again} == {first}
    empty_queues("jobs_check")


@override_settings(COMPOSITION={"DEPLOY_WINDOW_S": 60})
def test_once_its_window_has_passed_a_refused_message_is_parked() -> None:
    message = _fetched(**{INCOMPATIBLE_SINCE_OPTION: 1})  # first refused in 1970
    with pytest.raises(IncompatibleMessageError, match="a reason"):
        refuse(configured_broker(), message, IncompatibleMessageError("a reason"))
    assert not put_back(message)
    empty_queues("jobs_check")
