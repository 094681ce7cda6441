"""Invalidations made inside a transaction are durable at COMMIT: a PendingInvalidation row
commits with the business write, Redis is cleared after commit, the row is deleted once that
worked, and whatever was left behind (a killed process, a skipped callback) is replayed."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from contextlib import suppress
from urllib.parse import unquote, urlsplit

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from composition.cache import (
    InvalidationReplayComponent,
    cache_aside,
    get_cache_aside,
    invalidate,
    invalidate_namespace,
    replay_pending_invalidations,
)
from composition.cache.models import PendingInvalidation
from composition.locks.models import LockFence
from composition.testing import free_port, subprocess_env, wait_until
from tests.helpers import ROOT, unique

TABLE = PendingInvalidation._meta.db_table


def pending(*targets: str) -> int:
    """The recorded rows of ``targets``."""
    return PendingInvalidation.objects.filter(target__in=targets).count()


def statements(queries: CaptureQueriesContext, verb: str) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if q["sql"].startswith(verb) and TABLE in q["sql"]]


# The child commits a write that invalidates ``key`` and is SIGKILLed right after COMMIT, before
# the after-commit Redis delete runs: either an earlier on_commit callback kills it ("hook", which
# needs no knowledge of the implementation), or the apply step itself is patched to kill it
# ("apply"; mock.patch only to force that narrow race). Redis is reachable the whole time.
CHILD = """
import os, signal, sys
from unittest import mock
import django
django.setup()
from django.db import transaction
from composition.cache import invalidate
from composition.cache.invalidation import Invalidations
from composition.locks.models import LockFence

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

key, where = sys.argv[1], sys.argv[2]
patch = mock.patch.object(Invalidations, "apply_committed", die) if where == "apply" else mock.MagicMock()
with patch:
    with transaction.atomic():
        LockFence.objects.filter(resource=key).update(fence=2)
        if where == "hook":
            transaction.on_commit(die)
        invalidate(key)
        print("committing", flush=True)
print("survived", flush=True)
"""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("where", ["hook", "apply"])
def test_invalidation_survives_a_kill_right_after_commit(where: str) -> None:
    key = f"{unique('dur')}:1"
    LockFence.objects.create(resource=key, fence=1)
    engine = get_cache_aside()
    assert cache_aside(key, lambda: LockFence.objects.get(resource=key).fence, ttl_s=60) == 1

    child = subprocess.run([sys.executable, "-c", CHILD, key, where], env=subprocess_env(), cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == -9, child.stderr
    assert "committing" in child.stdout and "survived" not in child.stdout
    assert LockFence.objects.get(resource=key).fence == 2, "the write committed"
    assert engine.peek(key) == 1, "the child died before its after-commit delete"
    assert pending(key) == 1, "the invalidation did not commit with the write"

    replayer = InvalidationReplayComponent(interval_s=0.05)
    replayer.start()
    try:
        wait_until(lambda: engine.peek(key) is None, 10, message="the committed invalidation was never replayed")
    finally:
        replayer.stop(5)
    assert cache_aside(key, lambda: LockFence.objects.get(resource=key).fence, ttl_s=60) == 2
    assert pending(key) == 0


@pytest.mark.django_db(transaction=True)
def test_committed_invalidations_are_batched_deduplicated_and_leave_no_row() -> None:
    ns = unique("dur")
    first, second = f"{ns}:1", f"{ns}:2"
    other = f"{unique('dur')}:1"
    engine = get_cache_aside()
    for key in (first, second, other):
        cache_aside(key, lambda: "old", ttl_s=60)

    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        invalidate(first)
        invalidate(second)
        invalidate(first)  # the same key again: no second row, no second delete
        invalidate_namespace(other.split(":")[0])
        invalidate_namespace(other.split(":")[0])
        assert pending(first, second, other.split(":")[0]) == 3, "rows commit with the write"
        assert engine.peek(first) == "old", "deleted before the write committed"
    # One INSERT per distinct target.
    assert sum(sql.count("INSERT INTO") for sql in statements(queries, "INSERT")) == 3
    # Applied before the writer goes on, and the rows deleted with one DELETE for the whole
    # transaction.
    assert [engine.peek(key) for key in (first, second, other)] == [None, None, None]
    assert len(statements(queries, "DELETE")) == 1
    assert pending(first, second, other.split(":")[0]) == 0, "an applied invalidation leaves no row"


@pytest.mark.django_db(transaction=True)
def test_rolled_back_transaction_leaves_no_row_and_no_delete() -> None:
    key = f"{unique('dur')}:1"
    engine = get_cache_aside()
    cache_aside(key, lambda: "old", ttl_s=60)
    with pytest.raises(RuntimeError), transaction.atomic():
        invalidate(key)
        assert pending(key) == 1
        raise RuntimeError("the write failed")
    assert pending(key) == 0
    assert engine.peek(key) == "old"


@pytest.mark.django_db(transaction=True)
def test_a_read_after_an_invalidation_in_the_same_transaction_sees_the_write_and_caches_nothing() -> None:
    # Write, invalidate, read, in one transaction: the read hit the value the write replaces
    # (the invalidation waits for COMMIT), and with nothing cached it stored the uncommitted
    # value, which a rollback then left in the cache against the database.
    key, other = f"{unique('dur')}:1", f"{unique('dur')}:2"
    engine = get_cache_aside()

    def fence(resource: str) -> int:
        return LockFence.objects.get(resource=resource).fence

    LockFence.objects.create(resource=key, fence=1)
    LockFence.objects.create(resource=other, fence=1)
    assert cache_aside(key, lambda: fence(key), ttl_s=60) == 1
    with transaction.atomic():
        LockFence.objects.filter(resource=key).update(fence=2)
        invalidate(key)
        assert get_cache_aside().fetch(key, lambda: fence(key), ttl_s=60) == (2, "uncached")
    assert cache_aside(key, lambda: fence(key), ttl_s=60) == 2
    with pytest.raises(RuntimeError), transaction.atomic():
        LockFence.objects.filter(resource=other).update(fence=2)
        invalidate(other)
        assert cache_aside(other, lambda: fence(other), ttl_s=60) == 2
        raise RuntimeError("the write failed")
    assert engine.peek(other) is None, "nothing read inside the rolled-back transaction was cached"
    assert cache_aside(other, lambda: fence(other), ttl_s=60) == 1


@pytest.mark.django_db(transaction=True)
def test_autocommit_invalidation_applies_at_once_without_a_row() -> None:
    key = f"{unique('dur')}:1"
    engine = get_cache_aside()
    cache_aside(key, lambda: "old", ttl_s=60)
    with CaptureQueriesContext(connection) as queries:
        invalidate(key)
    assert engine.peek(key) is None
    assert statements(queries, "INSERT") == [] and pending(key) == 0


@pytest.mark.django_db(transaction=True)
def test_invalidation_repeated_after_a_rolled_back_savepoint_is_still_recorded() -> None:
    # Deduplication must not trust a row that a savepoint rollback removed.
    key = f"{unique('dur')}:1"
    engine = get_cache_aside()
    cache_aside(key, lambda: "old", ttl_s=60)
    with transaction.atomic():
        with suppress(RuntimeError), transaction.atomic():
            invalidate(key)
            raise RuntimeError("the inner write failed")
        assert pending(key) == 0
        invalidate(key)
        assert pending(key) == 1
    assert engine.peek(key) is None
    assert pending(key) == 0
    # The same with a savepoint atomic does not know of (transaction.savepoint()): its rollback
    # took the row, the target stayed in the batch, and the repeat was taken for recorded.
    cache_aside(key, lambda: "old", ttl_s=60)
    with transaction.atomic():
        savepoint = transaction.savepoint()
        invalidate(key)
        transaction.savepoint_rollback(savepoint)
        assert pending(key) == 0
        invalidate(key)
        assert pending(key) == 1, "the repeat is recorded: a Redis failure at COMMIT is replayed from it"
    assert engine.peek(key) is None


@pytest.mark.django_db(transaction=True)
def test_invalidation_skipped_by_a_failing_earlier_callback_is_replayed() -> None:
    # Django stops running on_commit callbacks at the first non-robust one that raises.
    key = f"{unique('dur')}:1"
    engine = get_cache_aside()
    cache_aside(key, lambda: "old", ttl_s=60)

    def broken() -> None:
        raise RuntimeError("someone else's callback")

    with pytest.raises(RuntimeError), transaction.atomic():
        transaction.on_commit(broken)
        invalidate(key)
    assert engine.peek(key) == "old", "the callback that deletes it was skipped"
    assert pending(key) == 1
    assert replay_pending_invalidations() >= 1
    assert engine.peek(key) is None
    assert pending(key) == 0


@pytest.mark.django_db(transaction=True)
def test_replaying_an_applied_row_is_harmless() -> None:
    key = f"{unique('dur')}:1"
    engine = get_cache_aside()
    PendingInvalidation.objects.create(alias=engine.alias, kind="key", target=key)
    PendingInvalidation.objects.create(alias=engine.alias, kind="key", target=key)  # twice, even
    assert replay_pending_invalidations() == 2
    assert cache_aside(key, lambda: "fresh", ttl_s=60) == "fresh"
    assert engine.peek(key) == "fresh"
    assert replay_pending_invalidations() == 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_replayers_skip_rows_another_one_holds() -> None:
    key = f"{unique('dur')}:1"
    engine = get_cache_aside()
    cache_aside(key, lambda: "old", ttl_s=60)
    PendingInvalidation.objects.create(alias=engine.alias, kind="key", target=key)
    claimed, release = threading.Event(), threading.Event()

    def other_replayer() -> None:  # holds the row as a replayer in mid-apply would
        try:
            with transaction.atomic():
                list(PendingInvalidation.objects.select_for_update().filter(target=key))
                claimed.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=other_replayer)
    thread.start()
    try:
        assert claimed.wait(10)
        started = time.monotonic()
        assert replay_pending_invalidations() == 0, "a claimed row was taken twice"
        assert time.monotonic() - started < 1.0, "a replayer waited for another one's lock"
        assert engine.peek(key) == "old"
    finally:
        release.set()
        thread.join(10)
    assert replay_pending_invalidations() == 1
    assert engine.peek(key) is None


# A project with a second database ("other") that writes cached data: the invalidation is
# recorded in that database's transaction while Redis is down, and the replay must find it there;
# a read in a transaction that invalidated on "other" goes to the database, as on "default".
# A child process: the alias has to be in DATABASES when Django starts.
OTHER_DATABASE_CHILD = """
import json, sys
import tests.settings as project_settings
project_settings.DATABASES["other"] = {**project_settings.DATABASES["default"], "NAME": sys.argv[2]}
import django
django.setup()
from django.conf import settings
from django.db import connections, transaction
from django.test import override_settings
from composition.cache import get_cache_aside, invalidate
from composition.cache.models import PendingInvalidation

key, down = sys.argv[1], sys.argv[3]
with connections["other"].schema_editor() as editor:
    editor.create_model(PendingInvalidation)
with override_settings(CACHES={"default": {**settings.CACHES["default"], "LOCATION": down}}), \\
        transaction.atomic(using="other"):
    invalidate(key, using="other")
recorded = PendingInvalidation.objects.using("other").filter(target=key).count()
engine = get_cache_aside()
engine.client.set(engine.keys.entry(key), b"stale")
replayed = engine.invalidations.replay_pending()
left = PendingInvalidation.objects.using("other").filter(target=key).count()
entry = engine.client.get(engine.keys.entry(key)) is not None
# A read later in the transaction that invalidated on "other" must not get what the write
# replaces (the invalidation waits for that COMMIT).
engine.fetch(key, lambda: "old", ttl_s=60)
with transaction.atomic(using="other"):
    invalidate(key, using="other")
    inside = list(engine.fetch(key, lambda: "new", ttl_s=60))
print(json.dumps({"recorded": recorded, "replayed": replayed, "left": left, "entry": entry, "inside": inside,
                  "after": engine.peek(key)}))
connections.close_all()
"""


@pytest.mark.django_db(transaction=True)
def test_an_invalidation_recorded_on_another_database_is_replayed_and_seen_by_reads_in_its_transaction(
        scratch_database_url: str) -> None:
    # The scratch database is dropped over a connection of its own, without the project's 30 s
    # statement timeout: on the server the whole gate shares, a DROP DATABASE once waited longer
    # than that for the rest of the server (beside four busy shards), and failed a passing test.
    key = f"{unique('dur')}:1"
    other = unquote(urlsplit(scratch_database_url).path[1:])
    child = subprocess.run([sys.executable, "-c", OTHER_DATABASE_CHILD, key, other,
                            f"redis://127.0.0.1:{free_port()}/0"],
                           env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings"), cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr[-3000:]
    outcome = json.loads(child.stdout.strip().splitlines()[-1])
    assert outcome == {"recorded": 1, "replayed": 1, "left": 0, "entry": False,
                       "inside": ["new", "uncached"], "after": None}, outcome
