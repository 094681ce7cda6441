"""The job decorator, retry policy, payload schema, fingerprints and inbox ledger, in-process."""

from __future__ import annotations

import random
import re
import threading
from typing import Any

import pytest
from django.db import connection, transaction
from dramatiq import Actor
from hypothesis import given
from hypothesis import strategies as st

from composition.broker.configured import configured_broker
from composition.errors import PayloadValidationError, PermanentError
from composition.jobs import JobPolicy, backoff_s, job
from composition.jobs.deadletters import fingerprint, normalise_message
from composition.jobs.inbox import record_processed
from composition.jobs.models import ProcessedMessage
from composition.jobs.schema import PayloadSchema
from tests.jobsapp import jobs


# -- backoff ----------------------------------------------------------------------------------------
@given(initial_s=st.floats(0.001, 100), factor=st.floats(1, 10_000), seed=st.integers(0, 2**32))
def test_backoff_grows_and_stays_within_bounds(initial_s: float, factor: float, seed: int) -> None:
    max_s = initial_s * factor
    rng = random.Random(seed)
    delays = [backoff_s(retries, initial_s=initial_s, max_s=max_s, rng=rng) for retries in range(40)]
    assert all(initial_s <= delay <= max_s for delay in delays)
    assert delays == sorted(delays)
    below_cap = [delay for delay in delays if delay < max_s]
    assert len(set(below_cap)) == len(below_cap), "below the cap every step must grow"


def test_backoff_has_jitter() -> None:
    delays = {backoff_s(0, initial_s=10, max_s=900) for _ in range(50)}
    assert len(delays) > 1
    assert all(10 <= delay <= 15 for delay in delays)


def test_backoff_rejects_inconsistent_bounds() -> None:
    with pytest.raises(ValueError):
        backoff_s(0, initial_s=5, max_s=1)
    with pytest.raises(ValueError):
        JobPolicy(max_attempts=0)
    with pytest.raises(TypeError):
        JobPolicy(permanent=("not an exception",))  # type: ignore[arg-type]


# -- the decorator ----------------------------------------------------------------------------------
def test_job_returns_a_dramatiq_actor_configured_with_the_policy() -> None:
    actor = jobs.flaky
    assert isinstance(actor, Actor)
    assert actor.actor_name == "flaky"
    assert actor.queue_name == jobs.RETRY_QUEUE
    assert actor.broker is configured_broker()
    assert configured_broker().get_actor("flaky") is actor
    assert actor.options["max_retries"] == 4  # max_attempts 5 counts runs, not retries
    assert actor.options["min_backoff"] == 50
    assert actor.options["max_backoff"] == 300
    assert PermanentError in actor.options["throws"]
    assert LookupError in jobs.lookup.options["throws"]
    assert jobs.slow.options["time_limit"] == 300_000


def test_job_defaults_follow_the_worker_policy() -> None:
    policy = JobPolicy()
    assert (policy.max_attempts, policy.initial_delay_s, policy.max_delay_s, policy.timeout_s) == (5, 10, 900, 120)


@pytest.mark.parametrize(("options", "says"), [
    ({"max_attempts": 2.5}, "max_attempts must be a whole number of at least 1, got 2.5"),
    ({"max_attempts": "3"}, "max_attempts must be a whole number"),
    ({"max_attempts": True}, "max_attempts must be a whole number"),
    ({"initial_delay_s": float("nan")}, "initial_delay_s must be a number of seconds above 0"),
    ({"max_delay_s": float("inf")}, "max_delay_s must be a number of seconds above 0"),
    ({"timeout_s": 1e20}, "timeout_s must be a number of seconds above 0 and at most"),
    ({"timeout_s": 0}, "timeout_s must be a number of seconds above 0"),
    ({"priority": "high"}, "priority must be a whole number, got 'high'"),
    ({"queue": "jobs_check.DQ"}, "not a delay or dead-letter queue's"),
    ({"permanent": ValueError}, "permanent must be a sequence of exception classes"),
    # Read from a setting as text: "no" is truthy, and ran the job under the ledger.
    ({"idempotent": "no"}, "idempotent must be True or False, got 'no'"),
    ({"idempotent": 0.0}, "idempotent must be True or False"),
    # "" fell back to the function's name, 5 raised from inside Dramatiq, a long one failed every publish.
    ({"actor_name": ""}, "actor_name must be a name of at most 255 characters without spaces, got ''"),
    ({"actor_name": "has space"}, "actor_name must be a name"),
    ({"actor_name": 5}, "actor_name must be a name"),
    ({"actor_name": "x" * 256}, "actor_name must be a name"),
])
def test_job_refuses_a_bad_policy_at_declaration(options: dict[str, Any], says: str) -> None:
    """Accepted, each failed later: in a worker thread (priority), in every system check
    (max_attempts), or deep in the broker (an infinite delay)."""
    with pytest.raises((ValueError, TypeError), match=re.escape(says)):
        job(**options)(lambda: None)


def test_job_refuses_an_async_function() -> None:
    """Dramatiq would call it and drop the coroutine unrun: a success that did nothing."""
    async def send_mail() -> None:
        pass

    with pytest.raises(TypeError, match=r"@job cannot run .*send_mail, an async def"):
        job(queue=jobs.CHECK_QUEUE, actor_name="never_declared_async")(send_mail)
    assert "never_declared_async" not in configured_broker().actors


def test_job_refuses_a_positional_only_parameter() -> None:
    """publish() gives the payload by keyword: the job could never be published."""
    def charge(invoice_id: int, /, amount: int = 0) -> None:
        pass

    with pytest.raises(TypeError, match=r"its parameter invoice_id is positional-only"):
        job(queue=jobs.CHECK_QUEUE, actor_name="never_declared_positional")(charge)
    assert "never_declared_positional" not in configured_broker().actors


def test_job_without_parentheses_is_a_job_with_every_default() -> None:
    """As Dramatiq's @actor allows; it was "job() takes 0 positional arguments but 1 was given"."""
    def bare_job_of_this_test(n: int) -> int:
        return n + 1

    try:
        actor = job(bare_job_of_this_test)
        assert isinstance(actor, Actor) and actor.actor_name == "bare_job_of_this_test"
        assert actor.options["job_policy"] == JobPolicy() and actor.queue_name == "default"
        assert actor(1) == 2
    finally:
        configured_broker().actors.pop("bare_job_of_this_test", None)
    with pytest.raises(TypeError, match=r"@job takes its options by keyword, e\.g\. @job\(queue='billing'\)"):
        job("billing")  # type: ignore[call-overload]


def test_job_declared_twice_under_one_name_is_refused() -> None:
    with pytest.raises(ValueError, match="already registered"):
        job(queue="jobs_check", actor_name="typed")(lambda: None)


# -- payload schema -------------------------------------------------------------------------------------
def _example(invoice_id: int, amount: float, note: str | None = None, tags: list[str] | None = None) -> None:
    pass


@pytest.mark.parametrize(("args", "kwargs", "error"), [
    ((), {"amount": 1.0}, "missing a required argument 'invoice_id'"),
    ((), {"invoice": 1, "amount": 1.0}, "unexpected keyword argument 'invoice'; missing a required argument "
                                        "'invoice_id'"),
    ((), {"invoice_id": 1, "amount": 1.0, "extra": 2}, "unexpected keyword argument 'extra'"),
    ((), {"invoice_id": "7", "amount": 1.0}, "argument 'invoice_id' must be int, got str"),
    ((), {"invoice_id": True, "amount": 1.0}, "argument 'invoice_id' must be int, got bool"),
    ((), {"invoice_id": 1, "amount": "1"}, "argument 'amount' must be float, got str"),
    ((), {"invoice_id": 1, "amount": 1, "note": 5}, "argument 'note' must be str | None, got int"),
    ((), {"invoice_id": 1, "amount": 1, "tags": "a"}, "argument 'tags' must be list[str] | None, got str"),
    ((), {"invoice_id": 1, "amount": 1, "tags": ["a", 2]}, "argument 'tags' must be list[str] | None, got int at "
                                                           "tags[1]"),
])
def test_schema_refuses_payloads_that_do_not_fit(args: tuple, kwargs: dict, error: str) -> None:
    schema = PayloadSchema.of(_example, "example")
    with pytest.raises(PayloadValidationError) as caught:
        schema.validate(args, kwargs)
    assert error in str(caught.value)
    assert isinstance(caught.value, PermanentError)


def test_schema_accepts_payloads_that_fit() -> None:
    schema = PayloadSchema.of(_example, "example")
    schema.validate((), {"invoice_id": 1, "amount": 2})  # an int is a fine float
    schema.validate((3, 1.5), {"note": None, "tags": ["x"]})


class _Invoice:
    pass


def _taking(annotation: Any) -> Any:
    """A job function of one argument, ``value``, annotated ``annotation``."""
    def fn(value: Any) -> None:
        pass

    fn.__annotations__ = {"value": annotation, "return": None}
    return fn


@pytest.mark.parametrize(("annotation", "value", "error"), [
    (list[int], [1, "x"], "must be list[int], got str at value[1]"),
    (list[int], [1, True], "must be list[int], got bool at value[1]"),
    (list[int], "1", "must be list[int], got str"),
    (list[int | None], [1, None, 2.5], "must be list[int | None], got float at value[2]"),
    (list[list[str]], [["a"], ["b", 3]], "must be list[list[str]], got int at value[1][1]"),
    (list[list[str]], [["a"], "b"], "must be list[list[str]], got str at value[1]"),
    (dict[str, list[int]], {"eur": [1], "usd": [2, "3"]}, "must be dict[str, list[int]], got str at value['usd'][1]"),
    # Only when the job is called as a function: JSON would have made the key a string.
    (dict[str, list[int]], {1: [1]}, "must be dict[str, list[int]], got int key in value"),
    (dict[int, str], {"1": 2}, "must be dict[int, str], got int at value['1']"),
    (list[int] | None, [1, "2"], "must be list[int] | None, got str at value[1]"),
    (list[_Invoice], {}, "must be list, got dict"),
])
def test_schema_checks_each_element_of_a_list_and_each_value_of_a_dict(annotation: Any, value: Any,
                                                                       error: str) -> None:
    schema = PayloadSchema.of(_taking(annotation), "containers")
    with pytest.raises(PayloadValidationError) as caught:
        schema.validate((), {"value": value})
    assert f"argument 'value' {error}" in str(caught.value)


@pytest.mark.parametrize(("annotation", "value"), [
    (list[int], [1, 2]),
    (list[int | None], [None, 3]),
    (list[list[str]], [[], ["a"]]),
    (dict[str, list[int]], {"eur": []}),
    (list[int] | None, None),
    # A JSON object's keys are always strings, whatever the annotation says of them.
    (dict[int, str], {"1": "one"}),
    # An element type JSON has no word for is left to the job: only the container is checked.
    (list[_Invoice], [1, "x", None]),
])
def test_schema_accepts_containers_that_fit_and_leaves_what_json_cannot_say_unchecked(annotation: Any,
                                                                                      value: Any) -> None:
    PayloadSchema.of(_taking(annotation), "containers").validate((), {"value": value})


def _positional_only(invoice_id: int, /, note: str = "") -> None:
    pass


def _keyword_only(*, invoice_id: int, note: str = "") -> None:
    pass


def _any_keywords(invoice_id: int, **extra: object) -> None:
    pass


def _many(*ids: int) -> None:
    pass


@pytest.mark.parametrize(("fn", "kwargs", "error"), [
    (_positional_only, {"invoice_id": 1}, "does not fit its arguments"),
    (_keyword_only, {"invoice_id": 1}, None),
    (_keyword_only, {"invoice_id": "1"}, "argument 'invoice_id' must be int, got str"),
    (_keyword_only, {"note": "x"}, "missing a required argument 'invoice_id'"),
    (_any_keywords, {"invoice_id": 1, "whatever": 2}, None),
    (_any_keywords, {"invoice_id": "1", "whatever": 2}, "argument 'invoice_id' must be int, got str"),
    (_many, {}, None),
    (_many, {"ids": 1}, "does not fit its arguments"),
])
def test_schema_checks_a_keyword_payload_as_signature_bind_would(fn: Any, kwargs: dict, error: str | None) -> None:
    # Keyword payloads (what publish() sends) skip Signature.bind when every key names an argument.
    schema = PayloadSchema.of(fn, "shapes")
    if error is None:
        schema.validate((), kwargs)
        return
    with pytest.raises(PayloadValidationError, match=error):
        schema.validate((), kwargs)


# -- fingerprints ---------------------------------------------------------------------------------------
def test_fingerprint_groups_the_same_failure_of_different_messages() -> None:
    a = fingerprint("charge", "ValueError", "invoice 41 not found (id 5f0c8a3e-1b2c-4d5e-8f90-a1b2c3d4e5f6)")
    b = fingerprint("charge", "ValueError", "invoice 42 not found (id 0a1b2c3d-1b2c-4d5e-8f90-a1b2c3d4e5f6)")
    assert a == b
    assert a != fingerprint("charge", "KeyError", "invoice 41 not found")
    assert a != fingerprint("refund", "ValueError", "invoice 41 not found")
    assert normalise_message("at 0x7f3a   after 12.5s") == "at <addr> after <n>s"
    # A number is a number however long: one group, not a second one for the big ids.
    assert fingerprint("receipt", "PermanentError", "payment 900001 does not exist") == fingerprint(
        "receipt", "PermanentError", "payment 4611686018427387904 does not exist")
    assert normalise_message("digest 9f86d081884c7d659a2feaa0c55ad015 of 1234567890123456789") \
        == "digest <hex> of <n>"


def test_fingerprint_keeps_an_http_status_and_drops_opaque_ids() -> None:
    # Gone for good and try-again-later are two causes, whatever the URL's numbers.
    gone = fingerprint("sync", "HTTPError", "HTTP 404 from /orders/81")
    assert gone == fingerprint("sync", "HTTPError", "HTTP 404 from /orders/97")
    assert gone != fingerprint("sync", "HTTPError", "HTTP 503 from /orders/81")
    assert fingerprint("sync", "APIError", "status_code=502") != fingerprint("sync", "APIError", "status_code=400")
    # Ids of other services mix letters and digits: one group, not one per charge.
    assert fingerprint("refund", "StripeError", "charge ch_3Mml8LrLkdIwHu7ix not found") == fingerprint(
        "refund", "StripeError", "charge ch_9QzPq2Xw7Yt4Rr1ab not found")
    # Whom it was for, or where it went, is not the cause: one SMTP outage is one group.
    assert fingerprint("receipt", "SMTPError", "could not send to ada@example.com: 550 mailbox unavailable") \
        == fingerprint("receipt", "SMTPError", "could not send to bob.o+x@mail.test.org: 550 mailbox unavailable")
    assert normalise_message("HTTP 503 from https://api.example.com/v1/orders/81?user=ada@example.com") \
        == "HTTP <status fad> from <url>"
    # Words without digits stay, so different causes keep their groups.
    assert fingerprint("refund", "KeyError", "'currency'") != fingerprint("refund", "KeyError", "'amount'")


# -- the inbox ledger ---------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_ledger_claims_a_message_id_once() -> None:
    with transaction.atomic():
        assert record_processed("m-1", "charge") is True
    with transaction.atomic():
        assert record_processed("m-1", "charge") is False
    assert ProcessedMessage.objects.filter(message_id="m-1").count() == 1


@pytest.mark.django_db(transaction=True)
def test_ledger_claim_rolls_back_with_the_effects() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        assert record_processed("m-2", "charge") is True
        raise RuntimeError("the job failed")
    with transaction.atomic():
        assert record_processed("m-2", "charge") is True


@pytest.mark.django_db(transaction=True)
def test_concurrent_redelivery_waits_for_the_first_and_then_skips() -> None:
    """Two deliveries of one message at once: the second blocks on the unique index while the
    first is in flight and sees the committed row afterwards."""
    first_claimed = threading.Event()
    release = threading.Event()
    outcome: list[bool] = []

    def first() -> None:
        try:
            with transaction.atomic():
                outcome.append(record_processed("m-3", "charge"))
                first_claimed.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=first)
    thread.start()
    assert first_claimed.wait(10)
    second: list[bool] = []

    def run_second() -> None:
        try:
            with transaction.atomic():
                second.append(record_processed("m-3", "charge"))
        finally:
            connection.close()

    other = threading.Thread(target=run_second)
    other.start()
    other.join(0.5)
    assert other.is_alive(), "the second claim must wait for the first transaction"
    release.set()
    thread.join(10)
    other.join(10)
    assert outcome == [True]
    assert second == [False]
