"""The test settings plus an app whose only migration is one long statement."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.slowmigration"]
