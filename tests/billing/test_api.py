"""The billing API as a client meets it: authentication on every endpoint (token and session
with CSRF), permissions, correct answers, a complete resource, and no input that gives a 5xx.
Concurrent readers and payers over HTTP: billing/test_api_concurrency.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.middleware.csrf import get_token
from django.test import Client, RequestFactory
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.jobs import send_payment_receipt
from billing.models import ApiToken, Invoice, Payment
from billing.tokens import DEFAULT_LIFETIME, create_token
from composition.broker.configured import configured_broker
from composition.cache import invalidate_namespace
from composition.outbox import OutboxMessage
from composition.testing import run_queued_jobs
from tests.helpers import post_json

# Transactional: invalidations and the outbox send run after COMMIT, as in production.
pytestmark = pytest.mark.django_db(transaction=True)

INVOICE = {"number": "INV-1", "customer": "Ada", "amount_cents": 12_500}


@pytest.fixture(autouse=True)
def _forget_cached_invoices() -> Iterator[None]:
    invalidate_namespace("invoice")  # ids start again in every test database
    yield
    configured_broker().flush("reminders")  # accepted reminders, for no later test's worker


def _user(name: str, *permissions: str) -> Any:
    user = get_user_model().objects.create_user(name, f"{name}@example.invalid", "pw")
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="billing",
                                                        codename__in=permissions))
    return user


def _token_client(user: Any) -> Client:
    return Client(headers={"Authorization": f"Bearer {create_token(user, uuid.uuid4().hex)[1]}"})


def _endpoints(invoice_id: int) -> list[tuple[str, str, dict[str, Any] | None, str]]:
    """Every endpoint: method, path, body, the permission it needs."""
    return [
        ("GET", "/api/invoices", None, "view_invoice"),
        ("POST", "/api/invoices", {**INVOICE, "number": "INV-NEW"}, "add_invoice"),
        ("GET", f"/api/invoices/{invoice_id}", None, "view_invoice"),
        ("POST", f"/api/invoices/{invoice_id}/pay", {"payment_id": "p-1", "amount_cents": 12_500}, "pay_invoice"),
        ("POST", f"/api/invoices/{invoice_id}/void", None, "change_invoice"),
        ("POST", f"/api/invoices/{invoice_id}/remind", {}, "change_invoice"),
    ]


def _call(client: Client, method: str, path: str, body: dict[str, Any] | None, **extra: Any) -> Any:
    if method == "GET":
        return client.get(path, **extra)
    return post_json(client, path, body, **extra) if body is not None else client.post(path, **extra)


def _state() -> tuple[Any, ...]:
    return (list(Invoice.objects.order_by("pk").values_list("pk", "status")), Payment.objects.count(),
            OutboxMessage.objects.count())


def test_anonymous_bad_token_and_unprivileged_callers_are_refused_and_change_nothing() -> None:
    invoice = Invoice.objects.create(**INVOICE)
    nobody = _user("nobody")
    session = Client(enforce_csrf_checks=True)
    session.force_login(nobody)
    before = _state()
    for method, path, body, _permission in _endpoints(invoice.pk):
        anonymous = _call(Client(enforce_csrf_checks=True), method, path, body)
        assert (anonymous.status_code, anonymous.json()["code"]) == (401, "not_authenticated"), path
        assert anonymous["WWW-Authenticate"].startswith("Bearer")
        for header in ("Bearer bil_not-a-token", "Basic YWRtaW46YWRtaW4=", "Bearer "):
            refused = _call(Client(headers={"Authorization": header}), method, path, body)
            assert (refused.status_code, refused.json()["code"]) == (401, "invalid_token"), (path, header)
        token = _call(_token_client(nobody), method, path, body)
        assert (token.status_code, token.json()["code"]) == (403, "permission_denied"), path
        logged_in = _call(session, method, path, body)
        expected = "permission_denied" if method == "GET" else "csrf_failed"
        assert (logged_in.status_code, logged_in.json()["code"]) == (403, expected), path
    assert _state() == before


def test_a_token_expires_with_its_own_error_and_its_maker_chooses_the_lifetime() -> None:
    admin = get_user_model().objects.create_superuser("keeper", "keeper@example.invalid", "pw")
    row, token = create_token(admin, "default")  # the default lifetime
    assert timedelta(days=89) < row.expires_at - timezone.now() <= DEFAULT_LIFETIME
    client = Client(headers={"Authorization": f"Bearer {token}"})
    assert client.get("/api/invoices").status_code == 200
    ApiToken.objects.filter(pk=row.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    expired = client.get("/api/invoices")
    assert (expired.status_code, expired.json()["code"]) == (401, "token_expired")
    assert "create_api_token" in expired.json()["error"]
    assert expired["WWW-Authenticate"].startswith("Bearer")

    out = StringIO()
    call_command("create_api_token", "keeper", "--name", "ci", "--expires-in-days", "0.5", stdout=out)
    assert timedelta(hours=11) < ApiToken.objects.get(name="ci").expires_at - timezone.now() <= timedelta(hours=12)
    assert Client(headers={"Authorization": f"Bearer {out.getvalue().strip()}"}).get("/api/invoices").status_code == 200
    call_command("create_api_token", "keeper", "--name", "forever", "--no-expiry", stdout=StringIO())
    assert ApiToken.objects.get(name="forever").expires_at is None
    for bad in ("0", "-3", "nan", "soon", "1e9"):
        with pytest.raises(CommandError, match="days"):
            call_command("create_api_token", "keeper", "--name", f"bad{bad}", "--expires-in-days", bad)
    with pytest.raises(CommandError, match="not allowed with"):
        call_command("create_api_token", "keeper", "--name", "both", "--no-expiry", "--expires-in-days", "3")
    with pytest.raises(ValueError, match="positive"):
        create_token(admin, "never-valid", lifetime=timedelta(0))
    assert not ApiToken.objects.filter(name__startswith="bad").exists()


def test_a_session_needs_the_csrf_token_and_the_permission_a_token_only_the_permission() -> None:
    succeeded = {"invoices": 201, "pay": 201, "void": 200, "remind": 202}
    for index in [index for index, endpoint in enumerate(_endpoints(0)) if endpoint[0] == "POST"]:
        # An open one for each, with an address to remind.
        invoice = Invoice.objects.create(**{**INVOICE, "number": f"INV-S{index}", "email": "ada@example.com"})
        method, path, body, permission = _endpoints(invoice.pk)[index]
        user = _user(f"u-{index}", "view_invoice")
        session = Client(enforce_csrf_checks=True)
        session.force_login(user)
        csrf = session.get("/api/invoices").cookies["csrftoken"].value  # a GET hands the browser its token
        before = _state()
        refused = _call(session, method, path, body, HTTP_X_CSRFTOKEN=csrf)
        assert (refused.status_code, refused.json()["code"]) == (403, "permission_denied"), path
        user.user_permissions.add(Permission.objects.get(content_type__app_label="billing", codename=permission))
        assert _call(session, method, path, body).json()["code"] == "csrf_failed", path  # the permission alone
        assert _state() == before, path
        answered = _call(session, method, path, body, HTTP_X_CSRFTOKEN=csrf)
        assert answered.status_code == succeeded[path.rsplit("/", 1)[1]], (path, answered.content)
    # The token path is CSRF-exempt: a browser never sends an Authorization header by itself.
    voider = _user("voider", "change_invoice")
    paid = Invoice.objects.get(status="paid")
    answered = _call(_token_client(voider), "POST", f"/api/invoices/{paid.pk}/void", None)
    assert answered.status_code == 409
    assert "csrftoken" not in answered.cookies  # nor does it hand a token client a CSRF cookie


def test_the_csrf_token_of_another_session_is_refused() -> None:
    user = _user("payer", "add_invoice")
    session = Client(enforce_csrf_checks=True)
    session.force_login(user)
    foreign = get_token(RequestFactory().get("/"))
    response = post_json(session, "/api/invoices", INVOICE, HTTP_X_CSRFTOKEN=foreign)
    assert (response.status_code, response.json()["code"]) == (403, "csrf_failed")
    assert not Invoice.objects.exists()


def test_an_invoice_asked_for_before_it_exists_is_visible_once_created(api_client: Client) -> None:
    with connection.cursor() as cursor:  # sequences are not transactional: the next insert takes +1
        cursor.execute("SELECT nextval(pg_get_serial_sequence('billing_invoice', 'id'))")
        next_id = cursor.fetchone()[0] + 1
    missing = api_client.get(f"/api/invoices/{next_id}")
    assert (missing.status_code, missing.json()["code"]) == (404, "invoice_not_found")
    created = post_json(api_client, "/api/invoices", INVOICE)
    assert (created.status_code, created.json()["id"]) == (201, next_id)
    found = api_client.get(f"/api/invoices/{next_id}")
    assert found.status_code == 200
    assert found.json() == {**created.json(), "payment": None, "receipt": None}


def test_the_invoice_shows_its_payment_and_then_its_receipt(api_client: Client) -> None:
    invoice = Invoice.objects.create(**INVOICE)
    url = f"/api/invoices/{invoice.pk}"
    assert api_client.get(url).json()["payment"] is None  # cached now
    assert post_json(api_client, f"{url}/pay", {"payment_id": "p-7", "amount_cents": 12_500}).status_code == 201
    body = api_client.get(url).json()
    assert body["status"] == "paid" and body["payment"]["payment_id"] == "p-7" and body["receipt"] is None
    send_payment_receipt.fn(payment_id=Payment.objects.get().pk)  # what the worker runs
    receipt = api_client.get(url).json()["receipt"]
    assert receipt["number"] == "R-INV-1" and receipt["created_at"]


@pytest.mark.empty_queues("billing")
def test_the_receipt_job_a_pay_queued_runs_in_the_test_itself(api_client: Client) -> None:
    """As docs/jobs.md shows a user's test: pay over HTTP, then run what is queued, in process."""
    invoice = Invoice.objects.create(**INVOICE)
    url = f"/api/invoices/{invoice.pk}"
    assert post_json(api_client, f"{url}/pay", {"payment_id": "p-8", "amount_cents": 12_500}).status_code == 201
    report = run_queued_jobs("billing")
    assert report.count("success", actor="send_payment_receipt") == 1 and len(report.runs) == 1
    assert api_client.get(url).json()["receipt"]["number"] == "R-INV-1"


def test_a_payment_id_reused_with_another_amount_is_a_conflict(api_client: Client) -> None:
    first = Invoice.objects.create(**INVOICE)
    second = Invoice.objects.create(**{**INVOICE, "number": "INV-2", "amount_cents": 99})
    paid = post_json(api_client, f"/api/invoices/{first.pk}/pay", {"payment_id": "p", "amount_cents": 12_500})
    assert paid.status_code == 201
    again = post_json(api_client, f"/api/invoices/{first.pk}/pay", {"payment_id": "p", "amount_cents": 12_500})
    assert (again.status_code, again.json()["created"]) == (200, False)
    for invoice, amount in ((first, 99), (second, 99)):
        response = post_json(api_client, f"/api/invoices/{invoice.pk}/pay", {"payment_id": "p", "amount_cents": amount})
        assert (response.status_code, response.json()["code"]) == (409, "payment_id_reused"), response.content
    assert Payment.objects.count() == 1


def test_void_moves_open_to_void_once_and_nothing_else(api_client: Client) -> None:
    open_one = Invoice.objects.create(**INVOICE)
    paid = Invoice.objects.create(**{**INVOICE, "number": "INV-2"})
    paying = post_json(api_client, f"/api/invoices/{paid.pk}/pay", {"payment_id": "p", "amount_cents": 12_500})
    assert paying.status_code == 201
    voided = api_client.post(f"/api/invoices/{open_one.pk}/void")
    assert (voided.status_code, voided.json()["status"], voided.json()["voided"]) == (200, "void", True)
    repeat = api_client.post(f"/api/invoices/{open_one.pk}/void")
    assert (repeat.status_code, repeat.json()["voided"]) == (200, False)
    assert api_client.get(f"/api/invoices/{open_one.pk}").json()["status"] == "void"
    pay_void = post_json(api_client, f"/api/invoices/{open_one.pk}/pay", {"payment_id": "q", "amount_cents": 12_500})
    assert (pay_void.status_code, pay_void.json()["code"]) == (409, "invoice_void")
    void_paid = api_client.post(f"/api/invoices/{paid.pk}/void")
    assert (void_paid.status_code, void_paid.json()["code"]) == (409, "invoice_paid")
    # The states hold in the database too, whatever writes the row.
    with pytest.raises(IntegrityError), transaction.atomic():
        Invoice.objects.filter(pk=paid.pk).update(status="refunded")


def test_the_list_pages_with_a_cursor_and_filters_by_status(api_client: Client) -> None:
    invoices = [Invoice.objects.create(**{**INVOICE, "number": f"INV-{n}"}) for n in range(7)]
    Invoice.objects.filter(pk__in=[invoices[1].pk, invoices[4].pk]).update(status="void")
    seen, cursor, pages = [], None, 0
    while True:
        response = api_client.get("/api/invoices", {"limit": 3, **({"cursor": cursor} if cursor else {})})
        assert response.status_code == 200
        seen += [row["number"] for row in response.json()["results"]]
        pages += 1
        cursor = response.json()["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"INV-{n}" for n in reversed(range(7))] and pages == 3
    void = api_client.get("/api/invoices", {"status": "void"}).json()
    assert [row["number"] for row in void["results"]] == ["INV-4", "INV-1"] and void["next_cursor"] is None
    for query, code in (({"status": "late"}, "invalid_parameter"), ({"limit": "0"}, "invalid_parameter"),
                        ({"limit": "x"}, "invalid_parameter"), ({"cursor": "bm9wZQ"}, "invalid_cursor"),
                        ({"cursor": "%%%"}, "invalid_cursor")):
        response = api_client.get("/api/invoices", query)
        assert (response.status_code, response.json()["code"]) == (400, code), query


def test_wrong_methods_and_media_types_get_json_errors(api_client: Client) -> None:
    invoice = Invoice.objects.create(**INVOICE)
    wrong = api_client.get(f"/api/invoices/{invoice.pk}/pay")
    assert (wrong.status_code, wrong.json()["code"], wrong["Allow"]) == (405, "method_not_allowed", "POST")
    assert api_client.delete(f"/api/invoices/{invoice.pk}").status_code == 405
    form = api_client.post("/api/invoices", INVOICE)  # form-encoded
    assert (form.status_code, form.json()["code"]) == (415, "unsupported_media_type")
    huge = api_client.get(f"/api/invoices/{2**70}")
    assert (huge.status_code, huge.json()["code"]) == (404, "invoice_not_found")


# -- no input gives a 5xx ---------------------------------------------------------------------
_FIELDS = ["number", "customer", "amount_cents", "currency", "payment_id", "x"]
_values = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False), st.text(max_size=70), st.lists(st.integers(), max_size=2),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_bodies = st.one_of(st.dictionaries(st.sampled_from(_FIELDS), _values, max_size=5),
                    st.builds(lambda d: {**d, **INVOICE} if d else dict(INVOICE),
                              st.dictionaries(st.sampled_from(_FIELDS), _values, max_size=2)),
                    st.lists(st.integers(), max_size=2), st.text(max_size=20), st.integers())
_raw = st.one_of(_bodies.map(lambda body: json.dumps(body).encode()), st.binary(max_size=40))
_paths: list[Callable[[int], str]] = [lambda i: "/api/invoices", lambda i: f"/api/invoices/{i}",
                                      lambda i: f"/api/invoices/{i}/pay", lambda i: f"/api/invoices/{i}/void",
                                      lambda i: f"/api/invoices/{i}/remind"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(_paths), invoice_id=st.one_of(st.integers(0, 5), st.integers(0, 2**66)),
       method=st.sampled_from(["GET", "POST", "PUT"]), raw=_raw,
       query=st.dictionaries(st.sampled_from(["status", "limit", "cursor"]), st.text(max_size=12), max_size=2))
def test_no_request_gets_a_5xx(api_client: Client, path: Callable[[int], str], invoice_id: int, method: str,
                               raw: bytes, query: dict[str, str]) -> None:
    if not Invoice.objects.exists():
        Invoice.objects.create(**INVOICE)
    url = path(invoice_id)
    if method == "GET":
        response = api_client.get(url, query)
    else:
        response = api_client.generic(method, url, raw, content_type="application/json")
    assert response.status_code < 500, (method, url, raw, response.content)
    if response.status_code >= 400:
        assert response["Content-Type"] == "application/json" and response.json()["code"], response.content
