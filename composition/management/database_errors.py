"""The operations commands' answer when the database does not: one line, not a traceback.

At 3 a.m. the database being away is the likeliest reason an operator runs these commands at
all; Django's OperationalError traceback then buries the one line that matters.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.core.management.base import CommandError
from django.db import InterfaceError, OperationalError

__all__ = ["database_must_answer"]


@contextmanager
def database_must_answer() -> Iterator[None]:
    """Raise CommandError (exit 1) saying so when the database cannot be reached or drops the
    connection; other database errors pass through as they are."""
    try:
        yield
    except (OperationalError, InterfaceError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CommandError(f"the database did not answer ({reason}). Run this again once it does: "
                           "what was done before it went away stays done, once.") from exc
