"""The billing API's front door: every answer under ``/api/`` is JSON, a client's mistake
included (an unknown route or id, a trailing slash, a wrong method, a body too large, chunked or
unreadable, a blank or bidi-laden text field), nothing is written and no error-level line is
logged. Through Django's test client, and through gunicorn with raw bytes, as a client sends them."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import threading
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from billing.models import Invoice, Payment
from composition.outbox import OutboxMessage
from composition.testing import subprocess_env
from tests.gunicorn_server import gunicorn

# Transactional: gunicorn's workers see only committed rows.
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.empty_queues("reminders"),
    pytest.mark.usefixtures("no_cached_invoices"),
]

INVOICE = {"number": "INV-1", "customer": "Ada", "amount_cents": 12_500}
TWENTY_MB = 20 * 1024 * 1024
# Blank to a reader: Python's str.strip() takes each (no-break and ideographic spaces included).
BLANKS = [" ", "   ", "\u00a0", "\u3000", "\u2003\u2009"]
BIDI_CONTROLS = ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069",
                 "\u200e", "\u200f", "\u061c"]


@pytest.fixture
def no_error_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Nothing at error level or above is logged in the test (Django's ``django.request`` and
    ``django.security.*`` included: they propagate to the root logger)."""
    caplog.set_level(logging.INFO)
    yield
    errors = [f"{record.name}: {record.getMessage()}" for record in caplog.records if record.levelno >= logging.ERROR]
    assert not errors, errors[:5]


def _routes(invoice_id: int) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every endpoint: its method, its path, and a body it takes."""
    return [
        ("GET", "/api/invoices", None),
        ("POST", "/api/invoices", {**INVOICE, "number": "INV-NEW"}),
        ("GET", f"/api/invoices/{invoice_id}", None),
        ("POST", f"/api/invoices/{invoice_id}/pay", {"payment_id": "p-1", "amount_cents": 12_500}),
        ("POST", f"/api/invoices/{invoice_id}/void", {}),
        ("POST", f"/api/invoices/{invoice_id}/remind", {}),
    ]


def _state() -> tuple[Any, ...]:
    return (list(Invoice.objects.order_by("pk").values_list("pk", "number", "customer", "email", "status")),
            Payment.objects.count(), OutboxMessage.objects.count())


def _send(client: Client, method: str, path: str, body: bytes | dict[str, Any] | None = None, **extra: Any) -> Any:
    raw = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
    return client.generic(method, path, raw, content_type="application/json", **extra)


def _assert_json_4xx(response: Any, status: int, code: str, where: Any) -> dict[str, Any]:
    assert response.status_code == status, (where, response.status_code, response.content[:300])
    assert response["Content-Type"] == "application/json", (where, response.content[:300])
    body: dict[str, Any] = response.json()
    assert body["code"] == code and body["error"], (where, body)
    return body


def test_every_route_answers_each_client_mistake_in_json_writes_nothing_and_logs_no_error(
        api_client: Client, no_error_logged: None) -> None:
    invoice = Invoice.objects.create(**INVOICE)
    anonymous = Client()
    before = _state()
    for method, path, body in _routes(invoice.pk):
        wrong_method = "DELETE" if method == "POST" else "PUT"
        mistakes: list[tuple[Client, str, str, Any, dict[str, Any], int, str]] = [
            (api_client, method, f"{path}/", body, {}, 404, "not_found"),  # a trailing slash
            (anonymous, method, f"{path}/", body, {}, 404, "not_found"),
            (api_client, wrong_method, path, body, {}, 405, "method_not_allowed"),
            (api_client, method, path, b"x" * TWENTY_MB, {}, 413, "body_too_large"),
            # What gunicorn hands Django for a chunked body: no Content-Length, so Django reads
            # none of it, and a void or remind would go ahead as if it had been sent empty.
            (api_client, method, path, None, {"HTTP_TRANSFER_ENCODING": "chunked"}, 411, "length_required"),
        ]
        if "/api/invoices/" in path:  # the routes with an id
            for bad_id in ("abc", "-1", "1.0", "0x1", "%20", "1%20", "%E2%80%AE1"):
                bad = path.replace(f"/{invoice.pk}", f"/{bad_id}")
                mistakes.append((api_client, method, bad, body, {}, 404, "not_found"))
        for client, verb, url, payload, extra, status, code in mistakes:
            _assert_json_4xx(_send(client, verb, url, payload, **extra), status, code, (verb, url, extra))
    # Text fields: a whitespace-only value of each (the list's only text input is its query).
    blank_cases: list[tuple[str, str, dict[str, Any] | None, str, str]] = [
        ("GET", "/api/invoices?status=%20", None, "invalid_parameter", "status"),
        ("GET", "/api/invoices?cursor=%20", None, "invalid_cursor", ""),
        ("POST", f"/api/invoices/{invoice.pk}/void", {"note": " "}, "unknown_field", "note"),
        ("POST", f"/api/invoices/{invoice.pk}/remind", {"note": " "}, "unknown_field", "note"),
    ]
    for field in ("number", "customer", "email"):
        blank_cases.append(("POST", "/api/invoices", {**INVOICE, "number": "INV-NEW", field: " "}, "invalid_field",
                            field))
    blank_cases.append(("POST", f"/api/invoices/{invoice.pk}/pay", {"payment_id": " ", "amount_cents": 12_500},
                        "invalid_field", "payment_id"))
    for method, url, body, code, field in blank_cases:
        answer = _assert_json_4xx(_send(api_client, method, url, body), 400, code, url)
        assert answer.get("field", answer.get("parameter", "")) == field, answer
    # A key given twice: which amount was meant is not for the server to guess (json keeps the last).
    twice = b'{"payment_id": "p-1", "amount_cents": 1, "amount_cents": 12500}'
    answer = _assert_json_4xx(_send(api_client, "POST", f"/api/invoices/{invoice.pk}/pay", twice), 400,
                              "invalid_json", "a key twice")
    assert "'amount_cents' appears twice" in answer["error"], answer
    # Beside the routes: any other path under /api/, whatever the method.
    for url in ("/api", "/api/", "/api/nothing", "/api/invoices/1/refund", "/api/invoices//pay", "/api/v2/invoices"):
        for verb in ("GET", "POST", "PATCH", "OPTIONS"):
            _assert_json_4xx(_send(anonymous, verb, url, {}), 404, "not_found", (verb, url))
    assert _state() == before


# A request in a process whose database refuses connections, as after a crash or during a
# failover; the process's own, so the test database stays where it is.
DATABASE_AWAY = """
import django
django.setup()
from django.test import Client
client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION="Bearer bil_anything")
for answer in (client.post("/api/invoices/5/pay", data="{}", content_type="application/json"),
               client.get("/api/invoices/5")):
    print(json.dumps([answer.status_code, answer["Content-Type"], answer.get("Retry-After"), answer.json()]))
"""


def test_the_database_not_answering_is_a_json_503_with_retry_after_not_an_html_500() -> None:
    import subprocess
    import sys

    from composition.testing import free_port

    away = f"postgresql://postgres@127.0.0.1:{free_port()}/away"
    done = subprocess.run([sys.executable, "-c", "import json\n" + DATABASE_AWAY], capture_output=True, text=True,
                          timeout=60, env=subprocess_env(DATABASE_URL=away))
    assert done.returncode == 0, done.stderr[-3000:]
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]
    assert answers == [[503, "application/json", "5", {"code": "unavailable", "error": "the database is not "
                                                        "answering; retry shortly", "retry_after_s": 5}]] * 2
    assert "database unavailable" in done.stderr + done.stdout  # a warning, not Django's error line
    assert '"level": "error"' not in done.stderr + done.stdout


def test_a_trailing_slash_is_named_in_the_404() -> None:
    answer = _assert_json_4xx(Client().get("/api/invoices/"), 404, "not_found", "/api/invoices/")
    assert "trailing slash" in answer["error"]


@pytest.mark.parametrize("value", BLANKS + [f"A{char}da" for char in BIDI_CONTROLS])
def test_text_fields_refuse_blank_values_and_bidi_controls_naming_the_field(api_client: Client, value: str) -> None:
    invoice = Invoice.objects.create(**INVOICE)
    before = _state()
    for field in ("number", "customer", "email"):
        sent = value if field != "email" else value.replace("da", "da@example.com")
        answer = _assert_json_4xx(_send(api_client, "POST", "/api/invoices", {**INVOICE, "number": "N-2", field: sent}),
                                  400, "invalid_field", (field, value))
        assert answer["field"] == field and field in answer["error"], answer
    answer = _assert_json_4xx(_send(api_client, "POST", f"/api/invoices/{invoice.pk}/pay",
                                    {"payment_id": value, "amount_cents": 12_500}), 400, "invalid_field", value)
    assert answer["field"] == "payment_id", answer
    assert _state() == before
    # Text around the rule is still taken: inner spaces, and right-to-left script itself.
    hebrew = "\u05e9\u05dc\u05d5\u05dd"
    created = _send(api_client, "POST", "/api/invoices", {**INVOICE, "number": "N 3", "customer": f"Ada {hebrew}"})
    assert created.status_code == 201, created.content


def test_the_admin_refuses_the_text_the_api_refuses() -> None:
    operator = Client()
    operator.force_login(get_user_model().objects.create_superuser("operator", "op@example.invalid", "pw"))
    form = {"number": "INV-A1", "customer": "Ada", "email": "", "amount_cents": 100, "currency": "EUR"}
    for field, value in (("number", "INV\u202e1"), ("customer", "\u202eadA")):
        refused = operator.post("/admin/billing/invoice/add/", {**form, field: value})
        assert refused.status_code == 200 and b"bidirectional" in refused.content, (field, refused.status_code)
    assert not Invoice.objects.exists()
    assert operator.post("/admin/billing/invoice/add/", form).status_code == 302  # blank optional email
    invoice = Invoice.objects.get()
    change = {"customer": "\u2067Ada", "email": ""}
    refused = operator.post(f"/admin/billing/invoice/{invoice.pk}/change/", change)
    assert refused.status_code == 200 and b"bidirectional" in refused.content
    assert Invoice.objects.get().customer == "Ada"


def test_input_django_cannot_read_is_a_json_4xx_not_an_html_page_or_an_error_line(
        api_client: Client, no_error_logged: None) -> None:
    """A session's POST is read by its CSRF check before the view: a form with too many fields,
    a multipart body without its boundary; and a query with too many parameters."""
    invoice = Invoice.objects.create(**INVOICE)
    user = get_user_model().objects.create_superuser("browser", "browser@example.invalid", "pw")
    session = Client(enforce_csrf_checks=True)
    session.force_login(user)
    session.get("/api/invoices")  # the CSRF cookie
    before = _state()
    void = f"/api/invoices/{invoice.pk}/void"
    many = "&".join(f"f{n}=1" for n in range(1_001)).encode()
    too_many = session.generic("POST", void, many, content_type="application/x-www-form-urlencoded")
    _assert_json_4xx(too_many, 400, "too_many_fields", "form")
    broken = session.generic("POST", void, b"--x\r\n", content_type="multipart/form-data")
    _assert_json_4xx(broken, 400, "invalid_body", "multipart")
    huge = session.generic("POST", void, b"a=" + b"x" * TWENTY_MB, content_type="application/x-www-form-urlencoded")
    _assert_json_4xx(huge, 413, "body_too_large", "form")
    query = "&".join(f"status={n}" for n in range(1_001))
    _assert_json_4xx(api_client.get(f"/api/invoices?{query}"), 400, "too_many_fields", "query")
    assert _state() == before


# -- through gunicorn, with the bytes a client sends --------------------------------------------
def _raw_request(base: str, head: str, body: Iterable[bytes] = ()) -> tuple[int, str, dict[str, Any]]:
    """Send ``head`` (the request line and headers) and then ``body`` from another thread, read
    the answer here: the server may answer before the body has all been sent."""
    address = urlsplit(base)
    with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
        def send() -> None:
            try:
                sock.sendall(head.replace("\n", "\r\n").encode())
                for piece in body:
                    sock.sendall(piece)
            except OSError:  # the test has its answer and closed the socket
                pass

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        response = http.client.HTTPResponse(sock)
        response.begin()
        payload = response.read()
        with contextlib.suppress(OSError):  # the server may have closed the connection already
            sock.shutdown(socket.SHUT_RDWR)  # a sender still writing the body stops
        sender.join(30)
    return response.status, response.getheader("Content-Type") or "", json.loads(payload)


@pytest.mark.slow
def test_through_gunicorn_chunked_and_oversized_bodies_are_refused_in_json_and_nothing_is_done(
        api_token: str, capfd: pytest.CaptureFixture[str]) -> None:
    invoice = Invoice.objects.create(**INVOICE)
    before = _state()
    with gunicorn(subprocess_env(), workers=1, threads=4) as base:
        def head(method: str, path: str, *headers: str) -> str:
            return "\n".join([f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {api_token}",
                              "Content-Type: application/json", *headers, "", ""])

        chunked = [b"2\r\n{}\r\n", b"0\r\n\r\n"]
        invoice_json = json.dumps({**INVOICE, "number": "INV-CHUNKED"}).encode()
        chunked_invoice = [f"{len(invoice_json):x}\r\n".encode() + invoice_json + b"\r\n", b"0\r\n\r\n"]
        cases = [
            (head("POST", f"/api/invoices/{invoice.pk}/void", "Transfer-Encoding: chunked"), chunked,
             411, "length_required"),
            (head("POST", f"/api/invoices/{invoice.pk}/remind", "Transfer-Encoding: chunked"), chunked,
             411, "length_required"),
            (head("POST", "/api/invoices", "Transfer-Encoding: chunked"), chunked_invoice, 411, "length_required"),
            (head("GET", "/api/invoices", "Transfer-Encoding: chunked"), chunked, 411, "length_required"),
            (head("POST", f"/api/invoices/{invoice.pk}/void", f"Content-Length: {TWENTY_MB}"),
             (b"x" * (1024 * 1024) for _ in range(20)), 413, "body_too_large"),
            (head("GET", "/api/invoices/abc"), [], 404, "not_found"),
            (head("POST", f"/api/invoices/{invoice.pk}/void/", "Content-Length: 2"), [b"{}"], 404, "not_found"),
        ]
        for request_head, body, status, code in cases:
            answer = _raw_request(base, request_head, body)
            assert answer[:2] == (status, "application/json") and answer[2]["code"] == code, \
                (request_head.splitlines()[0], answer)
        assert _state() == before
        # The same body with a Content-Length: read, and acted on.
        done = _raw_request(base, head("POST", f"/api/invoices/{invoice.pk}/void", "Content-Length: 2"), [b"{}"])
        assert done[0] == 200 and done[2]["voided"] is True, done
    logged = capfd.readouterr()
    lines = [json.loads(line) for line in (logged.out + logged.err).splitlines() if line.startswith("{")]
    errors = [line for line in lines if line.get("level") in ("error", "critical", "exception")]
    assert lines and not errors, errors[:5]
    assert "Traceback" not in logged.out + logged.err
