"""The connection budget against real PostgreSQL: connections per process, the server's limits
(what non-superusers may open), and the budget checked against them, or said to be unchecked
when the server does not answer. (``manage.py system`` prints it: tests/lifecycle/test_workers.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection, connections

from composition.db.budget import (
    BudgetLine,
    PoolLimits,
    ServerLimits,
    connection_budget,
    connections_per_process,
    server_limits,
)
from composition.testing import free_port


def _setting(name: str) -> int | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting(%s, true)", [name])
        value = cursor.fetchone()[0]
    return None if value is None else int(value)


def test_a_budget_line_is_its_processes_times_their_connections() -> None:
    line = BudgetLine("workers", processes=3, per_process=9, held_per_process=5)
    assert (line.total, line.held) == (27, 15)
    assert line.as_dict() == {"role": "workers", "processes": 3, "per_process": 9, "total": 27,
                              "held_per_process": 5, "held": 15}


def test_a_process_holds_a_connection_per_thread_or_its_pool_s_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    assert connections_per_process(threads=4, background_threads=5) == 9
    options = connections.settings["default"].setdefault("OPTIONS", {})
    monkeypatch.setitem(options, "pool", True)  # a pool with psycopg's defaults: not a bound we know
    assert connections_per_process(threads=4, background_threads=5) == 9
    monkeypatch.setitem(options, "pool", {"min_size": 2, "max_size": 6})
    assert connections_per_process(threads=4, background_threads=5) == 6


@pytest.mark.django_db
def test_the_server_s_limits_leave_out_the_reserved_connections() -> None:
    limits = server_limits()
    reserved = _setting("superuser_reserved_connections") or 0
    reserved += _setting("reserved_connections") or 0  # PostgreSQL 16 and later
    assert limits == ServerLimits(max_connections=_setting("max_connections"),
                                  usable=_setting("max_connections") - reserved)  # type: ignore[operator]
    assert limits.error is None


@pytest.fixture
def server_unreachable() -> Iterator[None]:
    """The default alias pointed at a closed port for the test (its transactional test's own
    connection is closed first, and reconnects to the real server after)."""
    settings_dict = connections["default"].settings_dict
    saved = {key: settings_dict.get(key) for key in ("HOST", "PORT")}
    connection.close()
    settings_dict.update(HOST="127.0.0.1", PORT=str(free_port()))
    try:
        yield
    finally:
        connection.close()
        settings_dict.update(saved)


@pytest.mark.django_db(transaction=True)  # the connection is closed and reopened elsewhere
@pytest.mark.usefixtures("server_unreachable")
def test_a_server_that_does_not_answer_leaves_the_budget_unchecked_not_passed() -> None:
    limits = server_limits()
    assert (limits.max_connections, limits.usable) == (None, None)
    assert limits.error is not None and limits.error.startswith("OperationalError: "), limits.error

    budget = connection_budget([BudgetLine("workers", 1000, 1000)], limits)
    assert budget["over_budget"] is False and budget["unchecked"] == limits.error
    assert (budget["max_connections"], budget["usable_connections"]) == (None, None)


@pytest.mark.django_db
def test_the_budget_is_over_only_beyond_what_non_superusers_may_open() -> None:
    limits = server_limits()
    assert limits.usable is not None
    workers = BudgetLine("workers", processes=2, per_process=9)
    web = BudgetLine("web", processes=1, per_process=limits.usable - 18)

    exact = connection_budget([workers, web], limits)
    assert exact == {"lines": [workers.as_dict(), web.as_dict()], "total": limits.usable,
                     "max_connections": limits.max_connections, "usable_connections": limits.usable,
                     "over_budget": False, "unchecked": None, "pooled": None}

    one_more = BudgetLine("web", processes=1, per_process=limits.usable - 17)
    over = connection_budget([workers, one_more], limits)
    assert over["total"] == limits.usable + 1 and over["over_budget"] is True


def test_behind_a_pooler_the_connections_held_at_once_must_fit_the_pool_and_the_pool_the_server() -> None:
    # 2 x (4 + 1) + 1 = 11 held at once; 2 x 12 + 1 = 25 client connections.
    lines = [BudgetLine("workers", 2, 12, held_per_process=5), BudgetLine("scheduler", 1, 1, held_per_process=1)]
    server = ServerLimits(max_connections=20, usable=17)

    def pooled(pool: PoolLimits) -> tuple[bool, dict[str, object]]:
        budget = connection_budget(lines, server, pool)
        return budget["over_budget"], budget["pooled"]

    # The 25 clients are more than the server's 17: behind the pooler that is no matter.
    assert pooled(PoolLimits(11, reserve=2, max_client_conn=100)) == (False, {
        "held_at_once": 11, "pool_size": 11, "reserve_pool": 2, "max_client_conn": 100, "pool_short": False,
        "clients_over": False})
    over, details = pooled(PoolLimits(10, reserve=0, max_client_conn=100))
    assert over and details["pool_short"]
    over, details = pooled(PoolLimits(11, reserve=0, max_client_conn=24))
    assert over and details["clients_over"] and not details["pool_short"]
    over, details = pooled(PoolLimits(16, reserve=2, max_client_conn=100))  # 18 server connections > 17
    assert over and not details["pool_short"]
    unread = connection_budget(lines, server, PoolLimits(None, error="refused"))
    assert unread["unchecked"] == "refused" and unread["pooled"]["pool_short"] is False
