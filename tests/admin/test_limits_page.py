"""The job limits on the operations page: each limited job's limit, the slots held now out of
it, the starts in the rate's window, and how many starts each limit delayed, as the cluster
holds them on Redis; a Redis that cannot be asked is said, not raised."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings
from django.test import override_settings

from composition.broker.configured import configured_broker
from composition.conf import conf
from composition.limits import limit_store
from composition.sampling import limited_jobs
from composition.testing import free_port
from tests.helpers import staff_client, table_row
from tests.jobsapp import jobs

pytestmark = pytest.mark.django_db

PAGE = "/admin/composition/operations/"


@pytest.fixture
def fresh_limits() -> Iterator[None]:
    store = limit_store()

    def clear() -> None:
        for actor in ("limited_call", "rated_call"):
            store.client.delete(*(f"{store.prefix}{actor}:{name}" for name in ("slots", "started", "starts", "meta")))

    clear()
    yield
    clear()


@pytest.mark.usefixtures("fresh_limits")
def test_the_page_shows_each_limited_job_its_limit_and_how_the_cluster_stands() -> None:
    assert {"limited_call", "rated_call"} <= set(limited_jobs(configured_broker()))
    assert "unlimited_call" not in limited_jobs(configured_broker())
    store = limit_store()
    limited, rated = jobs.limited_call.options["job_limits"], jobs.rated_call.options["job_limits"]
    for token in ("a", "b"):
        assert store.admit("limited_call", limited, token).started
    for index in range(50):
        assert store.admit("rated_call", rated, f"r{index}").started
    assert not store.admit("rated_call", rated, "over").started

    page = staff_client("view_operations").get(PAGE).content.decode()
    row = table_row(page, "data-job", "limited_call")
    assert "5 at once" in row and "2 / 5" in row and jobs.LIMIT_QUEUE in row
    row = table_row(page, "data-job", "rated_call")
    assert "50 starts per 5 s" in row and "50 / 50" in row and "at its limit" in row
    assert '<td class="num delayed-rate">1</td>' in row
    assert 'data-job="unlimited_call"' not in page


def test_an_unreachable_limits_redis_is_said_on_the_page() -> None:
    caches = {**settings.CACHES, "default": {**settings.CACHES["default"],
                                             "LOCATION": f"redis://127.0.0.1:{free_port()}/0"}}
    with override_settings(CACHES=caches, COMPOSITION=conf.as_dict()):
        page = staff_client("view_operations").get(PAGE).content.decode()
    assert "limits' Redis unavailable" in table_row(page, "data-job", "limited_call")


@pytest.mark.usefixtures("fresh_limits")
def test_queues_limits_lists_the_same_from_the_command_line() -> None:
    import io
    import json

    from django.core.management import call_command
    from django.core.management.base import CommandError

    store = limit_store()
    assert store.admit("limited_call", jobs.limited_call.options["job_limits"], "a").started
    out = io.StringIO()
    call_command("queues", "limits", stdout=out)
    line = next(line for line in out.getvalue().splitlines() if line.startswith("limited_call "))
    assert "5 at once" in line and "1/5 running" in line and "0 by concurrency" in line
    out = io.StringIO()
    call_command("queues", "limits", "--json", stdout=out)
    rows = {row["job"]: row for row in json.loads(out.getvalue())["limits"]}
    assert rows["limited_call"]["slots_held"] == 1 and rows["rated_call"]["rate"] == {"starts": 50, "window_s": 5.0}
    with pytest.raises(CommandError, match="limits takes no name"):
        call_command("queues", "limits", "limited_call")


def test_queues_limits_with_an_unreachable_limits_redis_prints_the_rest_and_exits_1() -> None:
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    caches = {**settings.CACHES, "default": {**settings.CACHES["default"],
                                             "LOCATION": f"redis://127.0.0.1:{free_port()}/0"}}
    out = io.StringIO()
    with override_settings(CACHES=caches, COMPOSITION=conf.as_dict()), \
            pytest.raises(CommandError, match=r"the limits' Redis could not be read: how .*limited_call.* is unknown"):
        call_command("queues", "limits", stdout=out)
    line = next(line for line in out.getvalue().splitlines() if line.startswith("limited_call "))
    assert "5 at once" in line and "limits' Redis unavailable" in line
