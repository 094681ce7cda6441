"""A jsonb value read by raw SQL: Django sets psycopg up to hand jsonb back as text (its
``JSONField`` decodes in ``from_db_value``), so a cursor's rows hold ``str`` where the ORM's
would hold the value. Code that forgot this read a replay's headers as text and saw no ledger key.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["decoded"]


def decoded(value: Any) -> Any:
    """``value``, a jsonb column or expression as a raw query returns it, decoded; None (SQL NULL)
    stays None, and a value already decoded (another driver's setup) is returned as it is."""
    if isinstance(value, str | bytes | bytearray):
        return json.loads(value)
    return value
