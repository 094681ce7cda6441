"""A job's time limit ends a database call that a cut network never answers
(``composition.db.blocked_calls``, through ``composition.broker.time_limits``' watchdog): the
connection seen busy with the call for ``CUT_AFTER_S`` past the time limit is cut, and the
interrupt lands. An overdue thread's idle connection is left alone, and so is a call of its that
answers within ``CUT_AFTER_S``. Through a fault proxy
that blackholes a Django connection to a private PostgreSQL server (TCP, which the proxy needs).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections
from django.db.backends.postgresql.base import DatabaseWrapper

from composition.broker.time_limits import CUT_AFTER_S, JobTimeLimit, TimeLimitExceeded
from composition.testing import FaultProxy
from tests.helpers import PROXIED_DATABASE

# Django's database blocker allows connections only to a test that may use the database.
pytestmark = pytest.mark.django_db

TIME_LIMIT_MS = 500


@pytest.fixture
def time_limit() -> Iterator[JobTimeLimit]:
    limit = JobTimeLimit(time_limit=TIME_LIMIT_MS)
    limit.manager.start()
    yield limit


def _wrapper(proxy: FaultProxy) -> DatabaseWrapper:
    """A Django connection to the private server through the proxy, with no timeout of its own."""
    settings = {**connections["default"].settings_dict, "HOST": "127.0.0.1", "PORT": proxy.port,
                "NAME": PROXIED_DATABASE, "USER": "postgres", "PASSWORD": "", "OPTIONS": {}, "CONN_MAX_AGE": 0}
    return DatabaseWrapper(settings, alias="blocked-calls")


def _run_as_a_job(time_limit: JobTimeLimit, body: Callable[[], None]) -> tuple[threading.Thread, list[Any]]:
    """``body`` in a thread under the time limit, as a worker thread runs a message; the
    outcome, an exception or "returned", and the time it took go in the list."""
    outcome: list[Any] = []

    def run() -> None:
        thread_id = threading.get_ident()
        time_limit.manager.add_timeout(thread_id, TIME_LIMIT_MS)
        began = time.monotonic()
        try:
            body()
            outcome.append("returned")
        except BaseException as exc:  # the interrupt, or the cut connection's error
            outcome.append(exc)
        finally:
            outcome.append(time.monotonic() - began)
            time_limit.manager.remove_timeout(thread_id)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_a_call_blocked_on_a_cut_network_ends_soon_after_its_time_limit(
        postgres_proxy: FaultProxy, time_limit: JobTimeLimit) -> None:
    wrappers: list[DatabaseWrapper] = []
    connected = threading.Event()

    def body() -> None:
        wrapper = _wrapper(postgres_proxy)
        wrappers.append(wrapper)
        wrapper.ensure_connection()
        connected.set()
        while postgres_proxy.mode != "blackhole":
            time.sleep(0.01)
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT 1")  # never answered

    thread, outcome = _run_as_a_job(time_limit, body)
    assert connected.wait(5), outcome
    postgres_proxy.blackhole()
    thread.join(TIME_LIMIT_MS / 1000 + CUT_AFTER_S + 2)
    assert not thread.is_alive(), "the thread stayed blocked in its database call past its time limit"
    error, took_s = outcome
    assert isinstance(error, (TimeLimitExceeded, Exception)) and error != "returned", outcome
    assert took_s < TIME_LIMIT_MS / 1000 + CUT_AFTER_S + 1.0
    raw = wrappers[0].connection
    assert raw is not None and raw.broken, "the blocked connection was not the one cut"


def test_an_overdue_thread_s_idle_connection_and_its_answered_calls_are_left_alone(
        postgres_proxy: FaultProxy, time_limit: JobTimeLimit) -> None:
    answers: list[Any] = []

    def body() -> None:
        wrapper = _wrapper(postgres_proxy)
        wrapper.ensure_connection()
        try:
            while True:  # Python code: the interrupt lands here
                time.sleep(0.01)
        except TimeLimitExceeded:
            pass
        time.sleep(CUT_AFTER_S + 0.5)  # overdue, unfinished, with its connection idle
        with wrapper.cursor() as cursor:
            # Waiting for the server across several of the watchdog's looks, not for CUT_AFTER_S.
            cursor.execute("SELECT 1 FROM pg_sleep(%s)", [CUT_AFTER_S / 2])
            answers.append(cursor.fetchone())
        wrapper.close()

    thread, outcome = _run_as_a_job(time_limit, body)
    thread.join(TIME_LIMIT_MS / 1000 + CUT_AFTER_S + 5)
    assert outcome[0] == "returned", outcome
    assert answers == [(1,)]
