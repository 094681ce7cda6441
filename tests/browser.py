"""Headless Chromium for the tests: Debian's ``chromium`` driven through Debian's
``chromedriver`` (``make browser`` installs both), never a downloaded driver or browser.

``chrome()`` yields a Selenium driver. Where the browser is not installed, tests that need it
skip, saying why, and fail where ``CI`` is set (``tool_missing``): CI installs the tools, so a
skip there would be a check that silently never ran. Screenshots go under
``artifacts_dir(test)``: ``.data/test-artifacts/<test>/`` (git-ignored), where a person can look
at them after the run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.helpers import ROOT

ARTIFACTS = ROOT / ".data" / "test-artifacts"


def tool_missing(reason: str) -> NoReturn:
    """Skip the calling test for ``reason``, or fail it when the environment variable ``CI``
    is set: there ``make browser`` and ``make promtool`` have installed the tools, so one that
    is missing is a broken set-up, not a machine without them."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI is set, so this test must run, not skip", pytrace=False)
    pytest.skip(reason)


def artifacts_dir(name: str) -> Path:
    path = ARTIFACTS / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


@contextmanager
def chrome(width: int = 1280, height: int = 900) -> Iterator[Any]:
    browser, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not browser or not driver_path:
        tool_missing("Debian's chromium and chromium-driver are not installed (make browser)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser  # with both paths given, Selenium Manager never runs
    # This machine has no network but localhost: Chromium's own background traffic is off.
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(flag)
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
        try:
            driver.set_page_load_timeout(30)
            yield driver
        finally:
            driver.quit()


def log_in_to_admin(driver: Any, base_url: str, username: str, password: str) -> None:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{base_url}/admin/login/?next=/admin/")
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    # The click only starts the form's POST: wait for the page it leads to, or for a login page
    # that answered with an error.
    try:
        WebDriverWait(driver, 15).until(lambda _: "/admin/login/" not in driver.current_url
                                        or driver.find_elements(By.CSS_SELECTOR, ".errornote"))
    except TimeoutException:
        pass
    if "/admin/login/" in driver.current_url:
        raise AssertionError(f"could not log in as {username}: {driver.page_source[:2000]}")


def wait_for(driver: Any, css: str, text: str = "") -> Any:
    """The first element at ``css`` holding ``text`` once the page a click is loading shows one:
    a click only starts the navigation, so reading at once could read the page being left. The
    text is matched ignoring case: Selenium reads it as CSS renders it (``text-transform``)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def found(_: Any) -> Any:
        elements = driver.find_elements(By.CSS_SELECTOR, css)
        return next((element for element in elements if text.casefold() in element.text.casefold()), False)

    try:
        return WebDriverWait(driver, 15, ignored_exceptions=(Exception,)).until(found)
    except Exception:
        raise AssertionError(f"no {css!r} holding {text!r} on {driver.current_url}:\n"
                             f"{driver.find_element(By.TAG_NAME, 'body').text[:3000]}") from None
