"""Helpers the project's own tests share (a user's tests want ``composition.testing`` instead)."""

from __future__ import annotations

import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The checkout: where ``manage.py``, the README and ``docs/`` are."""


def unique(prefix: str = "t") -> str:
    """A fresh name (a cache namespace, a lock key, a queue), so tests never see each other's."""
    return f"{prefix}{uuid.uuid4().hex[:10]}"
