"""What a connection really sends: libpq's own trace of the protocol, for tests that count round
trips (BEGIN and COMMIT included, which Django's query log never sees)."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection


@contextmanager
def sent_queries() -> Iterator[list[str]]:
    """The statement strings this thread's default connection sends meanwhile, one per round trip."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    queries: list[str] = []
    with tempfile.TemporaryFile(mode="w+") as trace:
        pgconn.trace(trace.fileno())
        try:
            yield queries
        finally:
            pgconn.untrace()
            trace.seek(0)
            queries += _queries(trace.read())


def _queries(trace: str) -> list[str]:
    """The Query messages of a libpq trace; a message's text may span lines (SQL with newlines),
    and every message starts a line with its timestamp, direction and length."""
    messages = re.split(r"\n(?=[^\t\n]+\t[FB]\t\d+\t)", trace)
    return [message.split("\tQuery\t", 1)[1].strip(' "\n') for message in messages
            if "\tF\t" in message and "\tQuery\t" in message]
