"""Errors of composition.locks: every failure to obtain or keep a lock is a LockNotAcquired."""

from __future__ import annotations

from composition.errors import CompositionError

__all__ = ["LockBackendUnavailable", "LockLost", "LockNotAcquired", "StaleFence", "TransactionRequired"]


class LockNotAcquired(CompositionError):
    """The lock ``name`` was not obtained (busy, timed out, or its backend is unreachable)."""

    def __init__(self, name: str, reason: str = "busy") -> None:
        super().__init__(f"lock {name!r} not acquired: {reason}")
        self.name = name
        self.reason = reason


class LockBackendUnavailable(LockNotAcquired):
    """The lock's store (Redis) could not be reached. A correctness lock never proceeds without it."""


class LockLost(LockNotAcquired):
    """A held Redis lock expired or was taken over before ``extend()``: its work is half done.
    A ``LockNotAcquired`` as well, but worded as what it is ("lost", not "not acquired")."""

    def __init__(self, name: str, reason: str = "it expired while held") -> None:
        super().__init__(name, reason)
        self.args = (f"lock {name!r} lost: {reason}",)


class TransactionRequired(CompositionError, RuntimeError):
    """A transaction-scoped lock was used outside ``transaction.atomic()``."""


class StaleFence(CompositionError):
    """A fenced write carried a fence older than the newest one seen for its resource."""

    def __init__(self, resource: str, fence: int, newest: int) -> None:
        super().__init__(f"fence {fence} for {resource!r} is older than {newest}; write refused")
        self.resource = resource
        self.fence = fence
        self.newest = newest
