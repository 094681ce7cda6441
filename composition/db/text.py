"""Whether a Python string is text PostgreSQL can store: a ``text`` column refuses NUL, and a lone
surrogate cannot be encoded at all. Checked where a key is given, so the error names the argument
rather than surfacing at an INSERT that aborts the caller's transaction."""

from __future__ import annotations

__all__ = ["storable_text"]


def storable_text(text: str) -> bool:
    """False when ``text`` holds a NUL character or a lone surrogate."""
    if "\x00" in text:
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
