"""The operations page as an operator uses it, in headless Chromium: log in, read the numbers,
open one failure group's dead letters, replay the group through the dead letters' admin
action, see the page change."""

from __future__ import annotations

import re
import socket
from typing import Any

import pytest
from django.contrib.auth.models import User

from composition import health
from composition.backpressure.depth import broker_counts
from composition.jobs.models import DeadLetter
from composition.outbox import OutboxMessage
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.testing import wait_until
from tests.admin.test_operations import bulk_dead_letters
from tests.browser import artifacts_dir, chrome, log_in_to_admin, wait_for
from tests.jobsapp import jobs

pytestmark = pytest.mark.slow


def _text(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, css).text).strip()


def _check_queue_depth(driver: Any) -> int:
    return int(_text(driver, f'#ops-queues tr[data-queue="{jobs.CHECK_QUEUE}"] td.depth'))


@pytest.mark.django_db(transaction=True)
@pytest.mark.empty_queues(jobs.CHECK_QUEUE, RELAY_QUEUE_NAME)
def test_an_operator_reads_the_page_and_replays_a_failure_group(live_server: Any, worker_processes: Any) -> None:
    from selenium.webdriver.common.by import By

    # A worker on a queue of its own (nothing of this test's runs there): the page lists it.
    # Only this test's worker: an earlier test's killed worker may still have a beat that turns
    # stale while the page loads.
    worker = worker_processes.spawn(["--processes", "1", "--threads", "1", "--queues", jobs.NOOP_QUEUE])
    mine = f"{socket.gethostname()}:{worker.pid}"
    wait_until(lambda: any(beat["worker"] == mine for beat in health.workers().detail.get("workers", [])),
               timeout_s=30, message=f"no heartbeat from {mine}")
    beating = [mine]

    User.objects.create_superuser("operator", "ops@example.com", "a long operator password")
    bulk_dead_letters(5, groups=2)  # groups of 3 and 2
    counts = {row["fingerprint"]: row["n"] for row in _groups()}
    largest = max(counts, key=lambda fingerprint: counts[fingerprint])
    shots = artifacts_dir("operations-page")
    base = live_server.url

    with chrome(height=1400) as driver:
        log_in_to_admin(driver, base, "operator", "a long operator password")
        driver.get(f"{base}/admin/")
        driver.find_element(By.CSS_SELECTOR, 'a[href="/admin/composition/operations/"]').click()
        wait_for(driver, "#ops-queues")
        driver.get(f"{base}/admin/composition/operations/?refresh=off")  # no reload under our feet
        driver.save_screenshot(str(shots / "1-operations.png"))
        # Styled: the admin's stylesheet was served and applied.
        assert driver.execute_script(
            "return getComputedStyle(document.querySelector('#header')).backgroundColor") != "rgba(0, 0, 0, 0)"
        assert _text(driver, "#ops-open-dead-letters strong") == "5" == str(_open())
        for fingerprint, count in counts.items():
            assert _text(driver, f'tr[data-fingerprint="{fingerprint}"] td.group-count') == str(count)
        broker = broker_counts(jobs.CHECK_QUEUE)
        assert _check_queue_depth(driver) == broker.ready + broker.delayed + _pending() == 0
        for name in beating:
            assert "beating" in _text(driver, f'#ops-workers tr[data-worker="{name}"]')

        # The group's link: the dead letters' list, filtered to that group and nothing else.
        driver.find_element(By.CSS_SELECTOR, f'tr[data-fingerprint="{largest}"] a').click()
        wait_for(driver, "#result_list")
        assert f"fingerprint={largest}" in driver.current_url
        # textContent: the column may be scrolled out of view in the list's box.
        listed = [row.find_element(By.CSS_SELECTOR, "td.field-short_fingerprint").get_attribute("textContent").strip()
                  for row in driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")]
        assert listed == [largest[:12]] * counts[largest] == [largest[:12]] * 3
        # ".paginator": a <p> up to Django 5.2, a <nav> (with a hidden heading) from Django 6.
        paginator = driver.find_element(By.CSS_SELECTOR, ".paginator").get_attribute("textContent")
        assert re.search(rf"(^|\s){counts[largest]} dead letters\b", paginator), paginator
        driver.save_screenshot(str(shots / "2-dead-letters.png"))
        driver.back()
        wait_for(driver, f'tr[data-fingerprint="{largest}"] input.replay-group')

        driver.find_element(By.CSS_SELECTOR, f'tr[data-fingerprint="{largest}"] input.replay-group').click()
        wait_for(driver, "#content", "This will replay 3 dead letters")
        driver.save_screenshot(str(shots / "3-confirm.png"))
        assert _open() == 5, "nothing happens before the confirmation"
        driver.find_element(By.CSS_SELECTOR, '#content form input[type="submit"]').click()
        wait_for(driver, "ul.messagelist", "Replayed 3 dead letter(s).")
        driver.save_screenshot(str(shots / "4-replayed.png"))

        driver.get(f"{base}/admin/composition/operations/?refresh=off")
        driver.save_screenshot(str(shots / "5-operations-after.png"))
        assert _text(driver, "#ops-open-dead-letters strong") == "2" == str(_open())
        assert not driver.find_elements(By.CSS_SELECTOR, f'tr[data-fingerprint="{largest}"]')
        # The three replays went out through the outbox: on the broker, or pending if it failed.
        broker = broker_counts(jobs.CHECK_QUEUE)
        assert _check_queue_depth(driver) == broker.ready + broker.delayed + _pending() == 3
    assert OutboxMessage.objects.filter(actor_name="charge").count() == 3


def _groups() -> list[dict[str, Any]]:
    from django.db.models import Count

    return list(DeadLetter.objects.filter(status="dead").values("fingerprint").annotate(n=Count("id")))


def _open() -> int:
    return DeadLetter.objects.filter(status="dead").count()


def _pending() -> int:
    return OutboxMessage.objects.filter(status="pending", queue_name=jobs.CHECK_QUEUE).count()


@pytest.mark.django_db(transaction=True)
def test_a_dead_letter_s_title_never_runs_under_its_replay_and_discard_buttons(live_server: Any) -> None:
    # Django's admin floats the object tools up beside the title with a negative margin, so a
    # long title (actor, message id, error class) ran on underneath the buttons, half hidden.
    from selenium.webdriver.common.by import By

    from tests.jobs.test_deadletters import dead_letter

    User.objects.create_superuser("operator", "ops@example.com", "a long operator password")
    letter = dead_letter("send_quarterly_statement_reminder_to_every_customer")
    with chrome() as driver:
        log_in_to_admin(driver, live_server.url, "operator", "a long operator password")
        driver.get(f"{live_server.url}/admin/composition/deadletter/{letter.pk}/change/")
        wait_for(driver, "form.dead-letter-action button", "Replay…")
        driver.save_screenshot(str(artifacts_dir("dead-letter-page") / "dead-letter.png"))
        title = driver.find_element(By.XPATH, f"//h2[contains(., '{letter.message_id}')]")
        overlaps = driver.execute_script("""
            const tools = document.querySelector('ul.object-tools').getBoundingClientRect();
            const text = document.createRange();
            text.selectNodeContents(arguments[0]);
            return Array.from(text.getClientRects()).filter(line => line.right > tools.left
                && line.left < tools.right && line.bottom > tools.top && line.top < tools.bottom).length;
        """, title)
        assert overlaps == 0, "the title's text runs under the object tools"
        assert title.is_displayed()
