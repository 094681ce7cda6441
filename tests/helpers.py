"""Helpers the project's own tests share (a user's tests want ``composition.testing`` instead)."""

from __future__ import annotations

import json
import os
import re
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from django.test import Client

    from billing.models import Invoice

ROOT = Path(__file__).resolve().parents[1]
# The database of the private PostgreSQL that fault-proxy tests reach (conftest's proxied_postgres_server).
PROXIED_DATABASE = "proxied"
"""The checkout: where ``manage.py``, the README and ``docs/`` are."""
RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
"""The RabbitMQ the rabbitmq-marked tests use."""


T = TypeVar("T")


def elsewhere(call: Callable[[], T]) -> T:
    """``call()``'s result (or exception) from another thread: another owner of a lock, as this
    thread's own ``redis_lock`` blocks refuse their lock to it (not re-entrant)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def unique(prefix: str = "t") -> str:
    """A fresh name (a cache namespace, a lock key, a queue), so tests never see each other's."""
    return f"{prefix}{uuid.uuid4().hex[:10]}"


class HeldInAnotherTransaction:
    """``with HeldInAnotherTransaction(take):`` another transaction, in a thread with its own
    connection, holds what ``take()`` locks (a row, an advisory lock, a table) until the block
    ends."""

    def __init__(self, take: Callable[[], object]) -> None:
        self.take = take
        self.locked = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        from django.db import connections, transaction

        try:
            with transaction.atomic():
                self.take()
                self.locked.set()
                self.release.wait(30)
        finally:
            connections.close_all()

    def __enter__(self) -> HeldInAnotherTransaction:
        self.thread.start()
        assert self.locked.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(10)


def post_json(client: Client, url: str, body: Any, **extra: Any) -> Any:
    """POST ``body`` encoded as JSON (whatever it is: a dict, a list, a bare string) with a
    Django test client; ``extra`` as ``Client.post`` takes it (headers=..., HTTP_*=...)."""
    return client.post(url, data=json.dumps(body), content_type="application/json", **extra)


def open_invoice(number: str, *, amount_cents: int = 500, email: str = "") -> Invoice:
    """An open invoice of Ada's, written straight to the database."""
    from billing.models import Invoice

    return Invoice.objects.create(number=number, customer="Ada", email=email, amount_cents=amount_cents)


def marked_block(page: Path, marker: str) -> str:
    """The fenced code block right after ``<!-- <marker> -->`` in ``page`` (the README or a docs
    page), as a reader pastes it."""
    match = re.search(rf"<!-- {re.escape(marker)} -->\n```[^\n]*\n(.*?)```", page.read_text(), re.S)
    assert match, f"{page.relative_to(ROOT)} has no block marked <!-- {marker} -->"
    return match.group(1)


class Clock:
    """A clock a test moves by hand (``clock.now += 5``), for what takes ``clock=``."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def staff_client(*codenames: str, username: str | None = None) -> Client:
    """A logged-in test client of a new staff user holding the permissions ``codenames``."""
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    user = User.objects.create_user(username or unique("op"), password="x", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def table_row(html: str, attribute: str, value: str) -> str:
    """The inner HTML of the page's table row whose ``attribute`` is ``value``."""
    match = re.search(rf'<tr {attribute}="{re.escape(value)}">(.*?)</tr>', html, re.S)
    assert match, f"no row with {attribute}={value!r}"
    return match.group(1)


def delete_rabbitmq_queue(queue: str, url: str | None = None) -> None:
    """``queue`` and its delay and dead-letter queues deleted from RabbitMQ (``RABBITMQ_URL``):
    what an earlier run left there would run in a test's hosts."""
    import pika
    from dramatiq.common import dq_name, xq_name

    url = url or RABBITMQ_URL
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for name in (queue, dq_name(queue), xq_name(queue)):
            channel.queue_delete(name)
    finally:
        connection.close()


# Every setting the library sets or lifts, for a session or a transaction.
LIBRARY_SETTINGS = ("statement_timeout", "idle_in_transaction_session_timeout", "lock_timeout", "synchronous_commit")


def session_seen(url: str) -> dict[str, Any]:
    """What a fresh client of ``url`` (through a pooler, or not) starts with: each of
    ``LIBRARY_SETTINGS`` and the advisory locks held in its database."""
    import psycopg

    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as client:
        seen: dict[str, Any] = {name: client.execute(f"SHOW {name}").fetchone()[0] for name in LIBRARY_SETTINGS}
        seen["advisory_locks"] = client.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())").fetchone()[0]
    return seen


def require_pgbouncer() -> None:
    """Skip the calling test where PgBouncer is not installed (fail where CI is set)."""
    import shutil

    from tests.browser import tool_missing

    if not (shutil.which("pgbouncer") or os.path.exists("/usr/sbin/pgbouncer")):
        tool_missing("PgBouncer is not installed (make pgbouncer)")


def pgbouncer_in_front(**options: Any) -> Any:
    """A throwaway PgBouncer in front of the server the tests' database is on (the machine's, or
    the embedded one, whose HOST is a socket directory)."""
    from django.db import connection

    from composition.testing import throwaway_pgbouncer

    require_pgbouncer()
    host = connection.settings_dict.get("HOST") or "127.0.0.1"
    port = int(connection.settings_dict.get("PORT") or 5432)
    return throwaway_pgbouncer(host, port, **options)


def next_message(consumer: Any, timeout_s: float = 10.0) -> Any:
    """The next message a Dramatiq consumer hands out (it answers None while it waits)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = next(consumer)
        if message is not None:
            return message
    raise AssertionError(f"no message within {timeout_s} s")


def sent_row(actor: str, *, sent_s_ago: float, queue: str = "jobs_crash", delay_s: float | None = None) -> Any:
    """An outbox row of ``actor`` marked sent ``sent_s_ago`` seconds ago, as a relay leaves it."""
    from datetime import timedelta

    from django.utils import timezone

    from composition.outbox.models import OutboxMessage

    sent_at = timezone.now() - timedelta(seconds=sent_s_ago)
    return OutboxMessage.objects.create(actor_name=actor, queue_name=queue, payload={}, status="sent",
                                        created_at=sent_at, sent_at=sent_at, delay_s=delay_s)
