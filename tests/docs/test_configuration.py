"""Every ``COMPOSITION`` key is documented: a key found only in the source is a key nobody sets."""

from __future__ import annotations

from composition.conf import DEFAULTS
from tests.helpers import ROOT


def test_every_setting_is_named_in_the_docs() -> None:
    docs = "".join(path.read_text() for path in sorted((ROOT / "docs").glob("*.md")))
    assert [key for key in DEFAULTS if f"`{key}`" not in docs] == []
