"""Recording dead letters: one row per message that failed for good, grouped by fingerprint."""

from __future__ import annotations

import hashlib
import math
import re
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone
from dramatiq.broker import MessageProxy
from dramatiq.common import q_name
from dramatiq.message import Message

from composition.broker.configured import configured_broker
from composition.errors import exception_text
from composition.metrics import DEAD_LETTERS_TOTAL
from composition.outbox.publish import VERSION_HEADER

if TYPE_CHECKING:
    from composition.jobs.models import DeadLetter

__all__ = ["PURGED_ERROR_CLASS", "TASK_PATH_OPTION", "Failure", "Purged", "dead_letter_fields", "error_class_name",
           "fingerprint", "normalise_message", "open_failures", "open_purged", "record_dead_letter"]

# An actor option: ``task_path(payload) -> str``, the task a message of an actor that runs many
# (the django.tasks backend's, one per queue) runs. Its dead letters are grouped, shown and
# filtered by that task, not only by the actor they share with every other task of the queue.
TASK_PATH_OPTION = "composition_task_path"

# Bounded so one huge error message cannot bloat a row or a fingerprint's input.
MAX_MESSAGE_CHARS = 2_000
MAX_TRACEBACK_FRAMES = 50
# message.options key where the first failure time of a message travels between its attempts.
FIRST_FAILED_OPTION = "composition_first_failed_ms"

_NORMALISERS: list[tuple[re.Pattern[str], str]] = [
    # Whom or where, not why: one SMTP outage over a thousand customers is one group, not a
    # thousand. URLs first (one may hold an "@").
    (re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>]+", re.I), "<url>"),
    (re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b"), "<email>"),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I), "<uuid>"),
    (re.compile(r"\b0x[0-9a-f]+\b", re.I), "<addr>"),
    # Hex with a letter in it: a long plain number is a number (below), whatever its length.
    (re.compile(r"\b(?=[0-9a-f]*[a-f])[0-9a-f]{16,}\b", re.I), "<hex>"),
    # Opaque ids of other services (a charge "ch_3Mml8Lr2Kd", an order "ORD7H2K9Q"): 8 or more
    # letters, digits, "_" or "-", with at least one digit and one letter.
    (re.compile(r"\b(?=[\w-]*\d)(?=[\w-]*[a-z])[\w-]{8,}\b", re.I), "<id>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
]
# An HTTP status is the cause, not an id: "HTTP 404" and "HTTP 503" (gone for good, try again
# later) must not share a group. Kept, spelled in letters so the number rule leaves it.
_HTTP_STATUS = re.compile(r"\b(HTTP(?:/\d(?:\.\d)?)?|status(?:[ _]code)?)([\s:=]+)([1-5]\d\d)\b", re.I)
_DIGITS_AS_LETTERS = str.maketrans("0123456789", "abcdefghij")


def normalise_message(message: str) -> str:
    """The error message with URLs, email addresses, ids, numbers and memory addresses replaced,
    so that the same failure of different messages ("invoice 41 not found", "invoice 42 not
    found") reads the same; an HTTP status ("HTTP 404", "status_code=503") is kept."""
    text = message[:MAX_MESSAGE_CHARS]
    text = _HTTP_STATUS.sub(lambda match: f"{match[1]}{match[2]}<status {match[3].translate(_DIGITS_AS_LETTERS)}>",
                            text)
    for pattern, replacement in _NORMALISERS:
        text = pattern.sub(replacement, text)
    return text.strip()


def error_class_name(exception: BaseException) -> str:
    """``ValueError`` for builtins, ``module.Qualname`` for everything else."""
    cls = type(exception)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


class Purged(Exception):  # a cause recorded, never raised
    """The error class of a purged message's dead letter (``composition.queues.purge_queue``):
    an operator's act, so neither counted as dead-lettered nor as open in the metrics."""


PURGED_ERROR_CLASS = error_class_name(Purged())


def open_failures() -> QuerySet[DeadLetter]:
    """Open dead letters (neither replayed nor discarded) that a failure made: the count
    ``composition_dead_letters_open`` and the operations page show. A purge's letters are apart
    (``open_purged``): an operator's act must not page (DeadLettersPilingUp)."""
    from composition.jobs.models import DeadLetter  # as in record_dead_letter

    return DeadLetter.objects.filter(status=DeadLetter.Status.DEAD).exclude(error_class=PURGED_ERROR_CLASS)


def open_purged() -> QuerySet[DeadLetter]:
    """Open dead letters a purge made, waiting for a replay or a discard."""
    from composition.jobs.models import DeadLetter

    return DeadLetter.objects.filter(status=DeadLetter.Status.DEAD, error_class=PURGED_ERROR_CLASS)


@dataclass(frozen=True)
class Failure:
    """What a dead letter says about why its message failed: taken from the exception when the
    last run ends (``of``), and kept as plain text so that it can travel in a message's options
    when the row cannot be written yet (``composition.jobs.middleware.dead_letters``)."""

    error_class: str
    error_message: str
    traceback: str

    @classmethod
    def of(cls, exception: BaseException) -> Failure:
        return cls(error_class_name(exception), _readable(_storable(exception_text(exception)[:MAX_MESSAGE_CHARS])),
                   _readable(_storable("".join(traceback.format_exception(exception, limit=MAX_TRACEBACK_FRAMES)))))

    @property
    def summary(self) -> str:
        """``Class: message``, as ``composition.jobs.middleware.job_metrics.error_text`` says an exception."""
        return f"{self.error_class.rpartition('.')[2]}: {self.error_message}"

    def as_option(self) -> dict[str, str]:
        return {"error_class": self.error_class, "error_message": self.error_message, "traceback": self.traceback}

    @classmethod
    def from_option(cls, value: Any) -> Failure:
        """The failure ``as_option`` wrote; raises ValueError for anything else."""
        if not isinstance(value, dict) or not all(isinstance(value.get(name), str)
                                                  for name in ("error_class", "error_message", "traceback")):
            raise ValueError(f"not a recorded failure: {value!r:.200}")
        return cls(value["error_class"], value["error_message"][:MAX_MESSAGE_CHARS], value["traceback"])


def fingerprint(actor: str, error_class: str, message: str, task_path: str = "") -> str:
    """A stable hex digest of actor (and task, for a task's message) + error class + normalised
    message."""
    basis = "\x1f".join((actor, *([task_path] if task_path else []), error_class, normalise_message(message)))
    return hashlib.blake2b(basis.encode(), digest_size=16).hexdigest()


def _from_millis(value: Any) -> datetime | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value / 1000, tz=UTC)
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")

# Unicode's bidirectional controls (embeddings, overrides, isolates and the implicit marks).
_BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _readable(text: str) -> str:
    """``text`` with each bidirectional control written out (``\\u202e``): error text comes from
    anywhere (a payload quoted in an exception), and one such control reverses what an operator
    reads after it, in the admin and in a terminal."""
    return _BIDI_CONTROLS.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


def _storable(value: Any) -> Any:
    """``value`` as PostgreSQL will store it, as a dead letter that cannot be written would be
    lost: text and jsonb refuse NUL and a lone surrogate (a name or an output decoded with
    ``surrogateescape``), which become U+FFFD; jsonb refuses NaN and the infinities, which become
    their text."""
    if isinstance(value, str):
        if _SURROGATE.search(value):
            # Two surrogates that make a pair become its character; a lone one, U+FFFD.
            value = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_storable(str(key)): _storable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    return _storable(repr(value))


def _task_path(message: Message[Any] | MessageProxy) -> str:
    """The task ``message`` runs, for an actor that runs many (``TASK_PATH_OPTION``), else ""."""
    actor = configured_broker().actors.get(message.actor_name)
    of = actor.options.get(TASK_PATH_OPTION) if actor is not None else None
    if of is None:
        return ""
    path = of(dict(message.kwargs or {}))
    # Cut to 1,024 bytes, not characters: a longer "path" (a mangled payload's) is cut rather than
    # a lost letter, in the column and in its index (whose rows stop at 2,704 bytes).
    return _storable(path).encode()[:1024].decode(errors="ignore") if isinstance(path, str) else ""


def dead_letter_fields(message: Message[Any] | MessageProxy, failure: Failure, attempts: int) -> dict[str, Any]:
    """The fields of ``message``'s dead letter, failed with ``failure`` after ``attempts`` runs,
    but for its id and its first and last failure times."""
    headers = message.options.get("composition")
    if not isinstance(headers, dict) and VERSION_HEADER in message.options:
        headers = {VERSION_HEADER: message.options[VERSION_HEADER]}  # a direct send's (VersionedActor)
    task_path = _task_path(message)
    return {
        "actor": message.actor_name,
        "task_path": task_path,
        "queue": q_name(message.queue_name),
        "payload": _storable(dict(message.kwargs or {})),
        "args": _storable(list(message.args or ())),
        "headers": _storable(headers) if isinstance(headers, dict) else {},
        "attempts": attempts,
        "error_class": failure.error_class,
        "error_message": failure.error_message,
        "traceback": failure.traceback,
        "fingerprint": fingerprint(message.actor_name, failure.error_class, failure.error_message, task_path),
    }


def record_dead_letter(message: MessageProxy, exception: BaseException | Failure, attempts: int) -> int:
    """Write (or refresh) the dead letter of ``message``, failed with ``exception`` (or the
    ``Failure`` taken from it earlier); returns its id.

    A message is dead-lettered once; should it fail for good again (redelivered after a crash
    between this write and the broker's acknowledgement), the same row is refreshed, and a row
    that was replayed or discarded meanwhile keeps its status.
    """
    # Imported here: the worker middleware imports this module, possibly before Django's apps are.
    from composition.jobs.models import DeadLetter

    failure = exception if isinstance(exception, Failure) else Failure.of(exception)
    now = timezone.now()
    fields = {**dead_letter_fields(message, failure, attempts), "last_failed_at": now}
    with transaction.atomic():
        row, created = DeadLetter.objects.select_for_update().get_or_create(
            message_id=message.message_id,
            defaults={**fields,
                      "first_failed_at": _from_millis(message.options.get(FIRST_FAILED_OPTION)) or now},
        )
        if not created:
            for name, value in fields.items():
                setattr(row, name, value)
            row.save(update_fields=[*fields])
    DEAD_LETTERS_TOTAL.labels(message.actor_name).inc()
    return int(row.pk)
