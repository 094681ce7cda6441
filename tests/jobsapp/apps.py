"""The test jobs app, with one opt-in fault for worker processes started by the tests.

``JOBSAPP_DEAD_LETTER_FAILURES=N`` in a ``runworkers`` child makes its first N attempts to
record a dead letter fail as a database blip would: the one narrow fault the dead-letter
robustness test needs, injected where the worker calls the recorder (never into the database).
"""

from __future__ import annotations

import os
import threading
from typing import Any
from unittest import mock

from django.apps import AppConfig
from django.db import OperationalError

FAILURES_ENV = "JOBSAPP_DEAD_LETTER_FAILURES"


class JobsappConfig(AppConfig):
    name = "tests.jobsapp"
    label = "jobsapp"

    def ready(self) -> None:
        failures = int(os.environ.get(FAILURES_ENV) or 0)
        if failures > 0:
            _fail_dead_letter_records(failures)


def _fail_dead_letter_records(failures: int) -> None:
    from composition.jobs.middleware import dead_letters

    real = dead_letters.record_dead_letter
    lock = threading.Lock()
    left = [failures]

    def flaky_record(*args: Any, **kwargs: Any) -> int:
        with lock:
            fail = left[0] > 0
            left[0] -= 1
        if fail:
            raise OperationalError("simulated database blip while recording a dead letter")
        return real(*args, **kwargs)

    mock.patch.object(dead_letters, "record_dead_letter", flaky_record).start()
