"""The example project's settings plus apps that exist only for the tests (test jobs and models).

Child processes started by tests inherit DJANGO_SETTINGS_MODULE, so they see the same jobs.
A child also takes COMPOSITION overrides as a JSON object in ``COMPOSITION_TEST_OVERRIDES``
(``override_settings`` cannot reach another process).
"""

import importlib.util
import json
import os
from urllib.parse import parse_qs, urlencode, urlsplit

from project.settings import *  # noqa: F403
from project.settings import CACHES, COMPOSITION, DATABASES, INSTALLED_APPS


def _redis_db(url: str) -> int | None:
    """The database number of a redis:// URL (``?db=`` wins over the path, as in redis-py)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return None
    query = parse_qs(parts.query)
    return int(query["db"][-1] if "db" in query else parts.path.strip("/") or 0)


def _with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    if "db" in query:
        query["db"] = str(db)
    return parts._replace(path=f"/{db}", query=urlencode(query)).geturl()


# The gate's own Redis databases: the configured ones moved by the smallest offset that lands on
# none of them. The tests flush theirs, empty its broker keys and read its heartbeats, so a
# ./run beside them (on the configured databases) loses nothing to them and never takes their
# messages. PostgreSQL is apart already: pytest-django's test_<name>.
#
# The main cell runs in shards side by side (tools/run_shards.py): shard N (TEST_SHARD, inherited
# by every process a test starts) takes the N-th such offset and test_<name>_<N> (N > 0), so no
# shard flushes, reads or consumes another's; each has its own temporary directory too (the
# registry of this host's workers lives there).
SHARD = int(os.environ.get("TEST_SHARD") or 0)
CONFIGURED_REDIS_DBS = {db for url in (CACHES["default"]["LOCATION"], COMPOSITION["BROKER_URL"])
                        if (db := _redis_db(url)) is not None}
_OFFSET = [k for k in range(1, 16)
           if CONFIGURED_REDIS_DBS.isdisjoint({(db + k) % 16 for db in CONFIGURED_REDIS_DBS})][SHARD]


def the_gate_s_own(url: str) -> str:
    db = _redis_db(url)
    return url if db is None else _with_db(url, (db + _OFFSET) % 16)


CACHES = {**CACHES, "default": {**CACHES["default"], "LOCATION": the_gate_s_own(CACHES["default"]["LOCATION"])}}
COMPOSITION = {**COMPOSITION, "BROKER_URL": the_gate_s_own(COMPOSITION["BROKER_URL"])}

INSTALLED_APPS = [*INSTALLED_APPS, "tests.outboxapp", "tests.jobsapp"]

# The example project's backend with a flush between transactional tests that keeps the tables'
# files (tests/backend/base.py); a DATABASE_ENGINE set in the environment is used as it is.
if not os.environ.get("DATABASE_ENGINE"):
    DATABASES = {**DATABASES, "default": {**DATABASES["default"], "ENGINE": "tests.backend"}}
if SHARD:
    DATABASES = {**DATABASES, "default": {**DATABASES["default"],
                                          "TEST": {"NAME": f"test_{DATABASES['default']['NAME']}_{SHARD}"}}}

# django.tasks through the outbox (tests/tasks/test_backend.py): Django 6's own package, else the backport
# (the "tasks" extra), whose app must be installed; without either, those tests skip.
if importlib.util.find_spec("django.tasks") or importlib.util.find_spec("django_tasks"):
    if not importlib.util.find_spec("django.tasks"):
        INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks"]
    from tests.tasks import upstream as _upstream_tasks_tests

    TASKS = {
        "default": {
            "BACKEND": "composition.tasks.OutboxBackend",
            # Queues of their own, so no other test's worker takes these tasks.
            "QUEUES": ["jobs_tasks", "jobs_tasks_plain"],
            "OPTIONS": {
                "MAX_ATTEMPTS": 3, "INITIAL_DELAY_S": 0.05, "MAX_DELAY_S": 0.2, "TIMEOUT_S": 20,
                "QUEUE_OPTIONS": {"jobs_tasks_plain": {"ATOMIC": False, "MAX_ATTEMPTS": 2}},
            },
        },
        # tests/tasks/upstream (its README.md): the upstream backends' tests, on queues of their own.
        _upstream_tasks_tests.ALIAS: _upstream_tasks_tests.BACKEND_SETTINGS,
    }
# Another cache alias on the same Redis (keys apart by prefix): the billing service's tests
# give it as a real alternate collaborator.
CACHES = {**CACHES, "alternate": {**CACHES["default"], "KEY_PREFIX": "alternate"}}
ROOT_URLCONF = "tests.urls"
# No host-wide drain mark unless a test sets its own: a test's mark must not drain the others.
# A message the code cannot run is parked at once: the tests that watch a deploy window set one.
COMPOSITION = {**COMPOSITION, "HEALTH_DRAIN_FILE": None, "DEPLOY_WINDOW_S": 0,
               **json.loads(os.environ.get("COMPOSITION_TEST_OVERRIDES") or "{}")}
# Nothing is collected for the tests; WhiteNoise then has no directory to serve (and says so).
STATIC_ROOT = None
