"""Settings of bench_throughput's naive Dramatiq worker: a plain Django project that knows
nothing of composition, on the bench's database and Redis (those of ``tests.settings``)."""

from tests.settings import CACHES as _TEST_CACHES
from tests.settings import COMPOSITION as _TEST_COMPOSITION
from tests.settings import DATABASES as _TEST_DATABASES
from tests.settings import SECRET_KEY

__all__ = ["BENCH_NAIVE_BROKER_URL", "CACHES", "DATABASES", "INSTALLED_APPS", "SECRET_KEY", "USE_TZ"]

# Django's own PostgreSQL backend, with the same connection settings as ours (CONN_MAX_AGE,
# CONN_HEALTH_CHECKS), so DbConnectionsMiddleware's close_old_connections() does the same work.
DATABASES = {"default": {**_TEST_DATABASES["default"], "ENGINE": "django.db.backends.postgresql"}}
CACHES = {"default": {**_TEST_CACHES["default"]}}
# The broker tests.settings gives composition (its own Redis database, not BROKER_URL's).
BENCH_NAIVE_BROKER_URL = _TEST_COMPOSITION["BROKER_URL"]
INSTALLED_APPS = ["django.contrib.contenttypes"]
USE_TZ = True
