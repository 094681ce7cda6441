"""The test settings on SQLite: only for checking that composition refuses a database other
than PostgreSQL (check E011)."""

from tests.settings import *  # noqa: F403

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
