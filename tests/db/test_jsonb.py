"""Raw SQL reads jsonb as text under Django, and ``composition.db.jsonb.decoded`` turns it into
the value: the premise (a release that hands jsonb back decoded would still pass through) and the
decoding, against real PostgreSQL."""

from __future__ import annotations

import pytest
from django.db import connection

from composition.db.jsonb import decoded

pytestmark = pytest.mark.django_db


def test_a_raw_query_reads_jsonb_as_text_and_decoded_makes_it_the_value() -> None:
    with connection.cursor() as cursor:
        cursor.execute("""SELECT '{"idempotency_key": "k", "n": [1, 2.5, null]}'::jsonb, NULL::jsonb, '"s"'::jsonb""")
        value, null, text = cursor.fetchone()
    assert isinstance(value, str), "Django sets psycopg up to return jsonb as text"
    assert decoded(value) == {"idempotency_key": "k", "n": [1, 2.5, None]}
    assert decoded(null) is None
    assert decoded(text) == "s"
    assert decoded({"already": "decoded"}) == {"already": "decoded"}
