"""Run a callback once after the current transaction commits, however often it is asked for.

``on_commit_once(key, hook)`` registers ``hook`` with ``transaction.on_commit`` unless one is still
queued under ``key`` in the current transaction, and returns the hook that will run; Django's own
on_commit rules (outermost COMMIT, savepoint rollback, autocommit) hold. ``open_savepoints(using)``
tells which savepoints are open now.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from django.db import transaction

__all__ = ["on_commit_once", "open_savepoints", "queued_once"]

H = TypeVar("H", bound=Callable[[], object])

# {key: (index in run_on_commit when registered, the function registered, hook)} on a connection.
_REGISTERED_ATTR = "_composition_on_commit_once"


def on_commit_once(key: Hashable, hook: H, *, using: str | None = None, robust: bool = False) -> H:
    """Run ``hook`` after the transaction on database ``using`` commits, unless a hook registered
    under ``key`` in this transaction is still queued: then nothing is registered and that hook is
    returned instead of ``hook``. Outside a transaction ``hook`` runs at once (and is returned).
    ``robust`` as in ``transaction.on_commit``: an exception of the hook is logged, not raised.
    Raises TransactionManagementError under manual transaction management, like on_commit.
    """
    connection = transaction.get_connection(using)
    if not connection.in_atomic_block:
        transaction.on_commit(_as_function(hook), using=using, robust=robust)
        return hook
    registered: dict[Hashable, tuple[int, Callable[[], None], Any]] | None = \
        getattr(connection, _REGISTERED_ATTR, None)
    if registered is None:
        registered = {}
        setattr(connection, _REGISTERED_ATTR, registered)
    earlier = registered.get(key)
    if earlier is not None and _queued(connection, earlier[0], earlier[1]):
        queued: H = earlier[2]
        return queued
    # Registered now: forget hooks of finished transactions and rolled-back savepoints.
    for stale in [k for k, (index, f, _) in registered.items() if not _queued(connection, index, f)]:
        del registered[stale]
    function = _as_function(hook)
    registered[key] = (len(connection.run_on_commit), function, hook)
    transaction.on_commit(function, using=using, robust=robust)
    return hook


def queued_once(key: Hashable, *, using: str | None = None) -> Any:
    """The hook ``on_commit_once`` registered under ``key`` in the current transaction on
    ``using`` and still queued, or None (none, outside a transaction, or rolled back)."""
    connection = transaction.get_connection(using)
    if not connection.in_atomic_block:
        return None
    registered = getattr(connection, _REGISTERED_ATTR, None) or {}
    earlier = registered.get(key)
    return earlier[2] if earlier is not None and _queued(connection, earlier[0], earlier[1]) else None


def _as_function(hook: Callable[[], object]) -> Callable[[], None]:
    """A new function calling ``hook``: its identity marks this one registration, and it has the
    ``__qualname__`` Django logs when a robust hook raises (a callable object has none)."""
    def function() -> None:
        hook()

    function.__qualname__ = getattr(hook, "__qualname__", type(hook).__qualname__)
    return function


def _queued(connection: Any, index: int, function: object) -> bool:
    """True while ``function`` is still in the connection's queue of on_commit hooks.

    Django has no public way to ask this: a savepoint rollback drops the hooks registered inside
    it, and the end of the transaction clears the queue, both silently. So we read the queue
    itself, ``connection.run_on_commit`` (a list of ``(savepoint ids, hook, robust)``, the list
    ``TestCase.captureOnCommitCallbacks`` reads too). ``index`` is where the hook was appended;
    a savepoint rollback can only remove entries, so when it is not there any more it is looked
    for below it.
    """
    hooks = connection.run_on_commit
    if index < len(hooks) and hooks[index][1] is function:
        return True
    return any(entry[1] is function for entry in hooks[:index])


def open_savepoints(using: str | None = None) -> frozenset[str | None]:
    """The savepoints open now on database ``using``: one id per enclosing ``atomic`` block
    below the outermost, ``None`` for a block without a savepoint (empty outside ``atomic``).
    What was done while these were open commits unless one of them is rolled back.

    Django keeps them in ``connection.savepoint_ids`` and offers no public accessor.
    """
    return frozenset(transaction.get_connection(using).savepoint_ids)


def savepoint_outside_atomic(using: str | None = None) -> bool:
    """Whether a savepoint that ``atomic`` does not know of may be open on database ``using``
    (``transaction.savepoint()``): what is written now may still be rolled back with it. True
    once any savepoint was taken on the connection (Django keeps no list of the others)."""
    return bool(transaction.get_connection(using).savepoint_state)
