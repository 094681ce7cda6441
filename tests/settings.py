"""The example project's settings plus apps that exist only for the tests (test jobs and models).

Child processes started by tests inherit DJANGO_SETTINGS_MODULE, so they see the same jobs.
"""

from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.outboxapp", "tests.jobsapp"]
