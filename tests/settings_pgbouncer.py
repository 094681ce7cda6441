"""The test settings for a project whose default database sits behind PgBouncer in transaction
mode (tests/db/test_pgbouncer.py gives its URL as DATABASE_URL)."""

from tests.settings import *  # noqa: F403
from tests.settings import COMPOSITION, DATABASES

DATABASES = {**DATABASES, "default": {**DATABASES["default"], "DISABLE_SERVER_SIDE_CURSORS": True}}
COMPOSITION = {**COMPOSITION, "TRANSACTION_POOLED_DATABASES": ["default"]}
