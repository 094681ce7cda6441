"""The test settings with a 1 s time limit and 2 attempts on the tasks' atomic queue: what the worker
of tests/tasks/test_backend.py's time-limit test runs with (a child process cannot see override_settings).
Enqueueing needs only the queue's name, so the test process keeps tests/settings.py."""

from tests.settings import *  # noqa: F403
from tests.settings import TASKS

TIME_LIMIT_S = 1
MAX_ATTEMPTS = 2

_default = TASKS["default"]
_options = _default["OPTIONS"]
TASKS = {**TASKS, "default": {**_default, "OPTIONS": {**_options, "QUEUE_OPTIONS": {
    **_options["QUEUE_OPTIONS"], "jobs_tasks": {"TIMEOUT_S": TIME_LIMIT_S, "MAX_ATTEMPTS": MAX_ATTEMPTS}}}}}
