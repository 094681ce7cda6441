"""``composition.conf``: what needs the app installed says so at once."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from composition.backpressure import BackpressureMiddleware
from composition.logging import RequestIdMiddleware
from tests.helpers import ROOT

WITHOUT_THE_APP = [app for app in settings.INSTALLED_APPS if app != "composition"]


def test_the_middleware_refuses_to_load_without_the_app() -> None:
    # Before, everything answered 200 until a publish met a table that was not there.
    with override_settings(INSTALLED_APPS=WITHOUT_THE_APP):
        for middleware in (RequestIdMiddleware, BackpressureMiddleware):
            with pytest.raises(ImproperlyConfigured, match='needs "composition" in INSTALLED_APPS'):
                middleware(lambda request: None)  # type: ignore[arg-type,return-value]
    assert RequestIdMiddleware(lambda request: None)  # type: ignore[arg-type,return-value]


def test_a_job_and_the_urls_refuse_without_the_app() -> None:
    # A project of its own: the broker is built once per process, and this one's exists already.
    script = """
import django
from django.conf import settings
settings.configure(INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth"],
                   DATABASES={}, ROOT_URLCONF=None)
django.setup()
from django.core.exceptions import ImproperlyConfigured
from composition.jobs import job
for attempt in ("job", "urls"):
    try:
        if attempt == "job":
            job()(lambda: None)
        else:
            import composition.urls
    except ImproperlyConfigured as exc:
        print(attempt, "refused:", exc)
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["job refused", "urls refused"], result.stdout
    assert all('needs "composition" in INSTALLED_APPS' in line for line in lines)
