"""The example project's settings plus apps that exist only for the tests (test jobs and models).

Child processes started by tests inherit DJANGO_SETTINGS_MODULE, so they see the same jobs.
A child also takes COMPOSITION overrides as a JSON object in ``COMPOSITION_TEST_OVERRIDES``
(``override_settings`` cannot reach another process).
"""

import json
import os

from project.settings import *  # noqa: F403
from project.settings import COMPOSITION, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.outboxapp", "tests.jobsapp"]
COMPOSITION = {**COMPOSITION, **json.loads(os.environ.get("COMPOSITION_TEST_OVERRIDES") or "{}")}
# Nothing is collected for the tests; WhiteNoise then has no directory to serve (and says so).
STATIC_ROOT = None
