"""A payload as JSON that PostgreSQL's jsonb stores as it is, checked value by value before
``json.dumps``: what it would silently change (a tuple, an int key), what JSON cannot hold (nan, a
date), what jsonb refuses (NUL, a lone surrogate), and ``OUTBOX_MAX_PAYLOAD_BYTES``. Each is a
publish error naming the value's path, raised at the call, not at the INSERT or the COMMIT."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from composition.conf import conf
from composition.outbox.errors import PayloadNotSerializableError, PayloadTooLargeError

__all__ = ["check_json", "encode_payload", "storable_json"]

# Deepest nesting a payload may have; payloads are meant to be a few ids, and the limit keeps the
# validation walk from recursing without bound.
_MAX_DEPTH = 32
# Python writes an int of at most 4,300 digits as text (sys.get_int_max_str_digits): 14,000 bits
# stay within it.
_MAX_INT_BITS = 14_000
# JSON's escape of NUL, not preceded by an escaped backslash (the text "\\u0000" is harmless).
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def encode_payload(payload: Any) -> bytes:
    """The payload as compact UTF-8 JSON; raises the publish errors for a bad or oversize payload."""
    if not isinstance(payload, Mapping):
        raise PayloadNotSerializableError(
            f"payload must be a dict of keyword arguments, got {type(payload).__name__}")
    payload = dict(payload)  # any mapping of keyword arguments, written as the dict it holds
    check_json(payload, "payload")
    encoded = storable_json(payload, "payload")
    limit = int(conf.OUTBOX_MAX_PAYLOAD_BYTES)
    if len(encoded) > limit:
        raise PayloadTooLargeError(len(encoded), limit)
    return encoded


def storable_json(value: Any, what: str) -> bytes:
    """``value`` (checked by ``check_json``) as compact UTF-8 JSON that PostgreSQL's jsonb stores
    as it is. Raises PayloadNotSerializableError for a NUL character (jsonb refuses ``\\u0000``)
    and for text that is not Unicode (a lone surrogate): PostgreSQL's error would come only at the
    INSERT or the COMMIT, and abort the caller's transaction."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise PayloadNotSerializableError(f"{what} holds a NUL character (\\u0000), which PostgreSQL cannot store")
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise PayloadNotSerializableError(
            f"{what} holds text that is not valid Unicode (a lone surrogate, {exc.object[exc.start:exc.end]!r})"
        ) from None


def check_json(value: Any, path: str, depth: int = 0) -> None:
    """Raise PayloadNotSerializableError naming the first value under ``path`` that JSON would
    change or cannot hold."""
    # json.dumps alone would turn {1: "a"} into {"1": "a"} and a tuple into a list without a word,
    # and the job would receive something else than what was published; refuse instead.
    if depth > _MAX_DEPTH:
        raise PayloadNotSerializableError(f"{path} is nested deeper than {_MAX_DEPTH} levels")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > _MAX_INT_BITS:
        raise PayloadNotSerializableError(f"{path} is an integer of more than 4,000 digits; pass it as a string")
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadNotSerializableError(f"{path} is {value!r}, which JSON cannot represent")
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            check_json(item, f"{path}[{index}]", depth + 1)
        return
    if isinstance(value, dict):  # json writes dicts, not every Mapping (a mappingproxy, ...)
        for item_key, item in value.items():
            if not isinstance(item_key, str):
                raise PayloadNotSerializableError(f"{path} has a non-string key {item_key!r}")
            check_json(item, f"{path}[{item_key!r}]", depth + 1)
        return
    raise PayloadNotSerializableError(
        f"{path} is a {type(value).__name__}, which is not JSON; pass ids and plain values")
