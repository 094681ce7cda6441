"""on_commit_once against real PostgreSQL transactions: nested savepoints, rollbacks, autocommit."""

from __future__ import annotations

from contextlib import suppress

import pytest
from django.db import transaction

from composition.db.transactions import on_commit_once, open_savepoints

pytestmark = pytest.mark.django_db(transaction=True)  # hooks run only on a real COMMIT


class Recorder:
    """A hook that counts its runs."""

    def __init__(self, name: str = "hook") -> None:
        self.name = name
        self.runs = 0

    def __call__(self) -> None:
        self.runs += 1


class Boom(Exception):
    pass


def test_autocommit_runs_at_once() -> None:
    hook = Recorder()
    assert on_commit_once("k", hook) is hook
    assert hook.runs == 1
    on_commit_once("k", hook)
    assert hook.runs == 2  # each autocommit "transaction" is its own


def test_several_registrations_in_one_transaction_run_once_after_the_outermost_commit() -> None:
    first, second = Recorder("first"), Recorder("second")
    with transaction.atomic():
        assert on_commit_once("k", first) is first
        with transaction.atomic():
            assert on_commit_once("k", second) is first  # the one already queued
            with transaction.atomic():
                on_commit_once("k", second)
        assert first.runs == 0, "released savepoints are not a commit"
        on_commit_once("k", second)
        assert first.runs == 0
    assert (first.runs, second.runs) == (1, 0)


def test_a_rolled_back_savepoint_drops_its_hook_and_a_later_registration_runs_once() -> None:
    dropped, later = Recorder("dropped"), Recorder("later")
    with transaction.atomic():
        with suppress(Boom), transaction.atomic():
            on_commit_once("k", dropped)
            raise Boom
        assert on_commit_once("k", later) is later, "the dropped hook must not be trusted"
        assert on_commit_once("k", Recorder()) is later
    assert (dropped.runs, later.runs) == (0, 1)


def test_a_hook_of_a_rolled_back_savepoint_alone_never_runs() -> None:
    dropped = Recorder()
    with transaction.atomic(), suppress(Boom), transaction.atomic():
        on_commit_once("k", dropped)
        raise Boom
    assert dropped.runs == 0


def test_a_hook_of_a_released_savepoint_survives_until_an_enclosing_one_rolls_back() -> None:
    inner, outer = Recorder("inner"), Recorder("outer")
    with transaction.atomic():
        with suppress(Boom), transaction.atomic():
            with transaction.atomic():
                on_commit_once("k", inner)
            assert on_commit_once("k", Recorder()) is inner  # released, still queued
            raise Boom
        assert on_commit_once("k", outer) is outer
    assert (inner.runs, outer.runs) == (0, 1)


def test_other_hooks_rolled_back_before_ours_do_not_hide_it() -> None:
    # Our hook moves down the queue when an earlier savepoint's hooks are dropped.
    other, ours = Recorder("other"), Recorder("ours")
    with transaction.atomic():
        with suppress(Boom), transaction.atomic():
            transaction.on_commit(other)
            transaction.on_commit(other)
            raise Boom
        on_commit_once("k", ours)
        with suppress(Boom), transaction.atomic():
            transaction.on_commit(other)
            raise Boom
        assert on_commit_once("k", Recorder()) is ours
    assert (other.runs, ours.runs) == (0, 1)


def test_a_rolled_back_transaction_runs_none_and_the_next_one_registers_afresh() -> None:
    lost, next_one = Recorder("lost"), Recorder("next")
    with suppress(Boom), transaction.atomic():
        on_commit_once("k", lost)
        raise Boom
    assert lost.runs == 0
    with transaction.atomic():
        assert on_commit_once("k", next_one) is next_one
    assert (lost.runs, next_one.runs) == (0, 1)


def test_each_transaction_and_each_key_runs_its_own_hook() -> None:
    a, b = Recorder("a"), Recorder("b")
    for _ in range(3):
        with transaction.atomic():
            for _ in range(5):
                on_commit_once("a", a)
                on_commit_once("b", b)
    assert (a.runs, b.runs) == (3, 3)


def test_a_robust_hook_that_raises_is_logged_and_the_others_still_run() -> None:
    class Failing:  # a callable object: no __qualname__ of its own
        def __call__(self) -> None:
            raise Boom

    after = Recorder()
    with transaction.atomic():
        on_commit_once("failing", Failing(), robust=True)
        on_commit_once("after", after)
    assert after.runs == 1


def test_open_savepoints_names_the_enclosing_savepoints() -> None:
    assert open_savepoints() == frozenset()
    with transaction.atomic():
        assert open_savepoints() == frozenset()
        with transaction.atomic():
            inner = open_savepoints()
            assert len(inner) == 1 and None not in inner
            with transaction.atomic(savepoint=False):
                assert open_savepoints() == inner | {None}
        assert open_savepoints() == frozenset()
