"""Request input checked against what the columns hold, so bad input is a 400 naming the field,
never a database error (a 500). Text is also refused when a person could not read it back as
sent: blank, or holding characters that reorder what is shown around them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.core.mail.message import sanitize_address
from django.core.validators import validate_email
from django.http import HttpRequest

from billing.api import ApiError
from billing.models import MAX_AMOUNT_CENTS

__all__ = ["AMOUNT", "Email", "Integer", "Text", "parse_json_body", "parse_query_int"]

# NUL cannot be stored in a PostgreSQL text column; other control characters are refused too,
# as no field here has a use for them.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Unicode's bidirectional controls (embeddings, overrides, isolates and the implicit marks): one
# in a customer's name reverses or reorders the text around it wherever it is shown (the admin).
_BIDI_CONTROL = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# JSON may spell half a UTF-16 pair ("\ud800"): Python then holds a string no UTF-8 encoder (the
# database's) takes, and the save would fail with a 500.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Text:
    max_length: int
    min_length: int = 1
    required: bool = True
    pattern: str | None = None
    pattern_hint: str = ""

    def parse(self, name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise _invalid(name, "must be a string")
        if not self.min_length <= len(value) <= self.max_length:
            raise _invalid(name, f"must have {self.min_length} to {self.max_length} characters")
        if not value.strip():
            raise _invalid(name, "must not be blank (whitespace only)")
        if _CONTROL.search(value):
            raise _invalid(name, "must not contain control characters")
        if _BIDI_CONTROL.search(value):
            raise _invalid(name, "must not contain Unicode bidirectional control characters (such as U+202E)")
        if _LONE_SURROGATE.search(value):
            raise _invalid(name, "must be valid Unicode (a lone surrogate such as \\ud800 is not)")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise _invalid(name, f"must be {self.pattern_hint}")
        return value


@dataclass(frozen=True)
class Email(Text):
    """An address Django's validator and its mail backends both take: one the receipt job could
    not send to would fail every attempt, and open the email breaker for every customer."""

    def parse(self, name: str, value: Any) -> str:
        value = super().parse(name, value)
        try:
            validate_email(value)
            sanitize_address(value, "utf-8")  # what an SMTP backend does to every recipient
        except (ValidationError, ValueError, TypeError, AttributeError, IndexError):
            raise _invalid(name, "must be an email address such as 'ada@example.com'") from None
        return value


@dataclass(frozen=True)
class Integer:
    minimum: int
    maximum: int
    required: bool = True

    def parse(self, name: str, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _invalid(name, "must be an integer")
        if not self.minimum <= value <= self.maximum:
            raise _invalid(name, f"must be between {self.minimum} and {self.maximum}")
        return value


AMOUNT = Integer(1, MAX_AMOUNT_CENTS)


def _invalid(name: str, what: str) -> ApiError:
    return ApiError(400, "invalid_field", f"field {name!r} {what}", field=name)


def _without_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused when a key repeats: which ``amount_cents`` of two was meant is not
    for the server to guess (Python's json keeps the last, other parsers the first)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"the key {key!r} appears twice")
        found[key] = value
    return found


def parse_json_body(request: HttpRequest, fields: dict[str, Text | Integer]) -> dict[str, Any]:
    """The body as a JSON object holding exactly ``fields`` (the optional ones may be absent).
    Raises ``ApiError``; a body Django cannot read (too large, cut short) raises Django's own
    exception, which ``billing.api.endpoint`` answers."""
    content_type = request.content_type or ""
    if content_type != "application/json":
        raise ApiError(415, "unsupported_media_type", "send the body as Content-Type: application/json")
    try:
        data = json.loads(request.body or b"", object_pairs_hook=_without_repeated_keys)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {exc}"[:200]) from exc
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_body", "the body must be a JSON object")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ApiError(400, "unknown_field", f"unknown field {unknown[0]!r}; expected {', '.join(sorted(fields))}",
                       field=unknown[0])
    parsed: dict[str, Any] = {}
    for name, spec in fields.items():
        if name not in data:
            if spec.required:
                raise ApiError(400, "missing_field", f"field {name!r} is required", field=name)
            continue
        parsed[name] = spec.parse(name, data[name])
    return parsed


def parse_query_int(request: HttpRequest, name: str, *, default: int, minimum: int, maximum: int) -> int:
    raw = request.GET.get(name)
    if raw is None:
        return default
    if not re.fullmatch(r"[0-9]{1,6}", raw):
        raise ApiError(400, "invalid_parameter", f"parameter {name!r} must be an integer", parameter=name)
    value = int(raw)
    if not minimum <= value <= maximum:
        raise ApiError(400, "invalid_parameter", f"parameter {name!r} must be between {minimum} and {maximum}",
                       parameter=name)
    return value
