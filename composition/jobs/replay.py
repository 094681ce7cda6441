"""Replaying and discarding dead letters: the operator's two ways out.

A replay writes a new outbox message and marks the dead letter "replayed" in one transaction, under
a row lock on it, so a dead letter is replayed at most once (a second try raises
``DeadLetterStateError``). The replay carries the original message id as its idempotency key, so
it and a late redelivery of the original cannot both have an effect, and its priority. An actor
may keep state beside its messages (a ``django.tasks`` result): its ``RESOLVED_HOOK_OPTION`` is
called in the transaction that replays or discards one of its dead letters. Bulk actions
(``filter_dead_letters()``) act row by row, each in its own transaction.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from composition.broker.configured import configured_broker
from composition.broker.priorities import PRIORITY_HEADER
from composition.errors import (
    AmbiguousFingerprintError,
    CompositionError,
    DeadLetterStateError,
    PayloadValidationError,
)
from composition.jobs.models import DeadLetter
from composition.outbox.errors import UnknownActorError
from composition.outbox.publish import IDEMPOTENCY_KEY_HEADER, VERSION_HEADER, VERSIONS_OPTION, publish_with_headers

__all__ = [
    "DISCARD_PERMISSION",
    "REPLAY_PERMISSION",
    "RESOLVED_HOOK_OPTION",
    "BulkResult",
    "discard",
    "discard_many",
    "filter_dead_letters",
    "replay",
    "replay_many",
]

# At most this many groups are named when a fingerprint prefix is ambiguous.
_MAX_CANDIDATES = 50

REPLAY_PERMISSION = "composition.replay_deadletter"
DISCARD_PERMISSION = "composition.discard_deadletter"
# An actor option: ``hook(dead_letter, replay_row)``, called in the transaction that replays one of
# the actor's dead letters (``replay_row``: the new outbox row) or discards it (None).
RESOLVED_HOOK_OPTION = "composition_dead_letter_resolved"


def filter_dead_letters(*, ids: Iterable[int] | None = None, actor: str | None = None,
                        task: str | None = None, error: str | None = None, fingerprint: str | None = None,
                        status: str | None = DeadLetter.Status.DEAD,
                        max_id: int | None = None) -> QuerySet[DeadLetter]:
    """Dead letters matching every given filter; ``task`` is a django.tasks task's module path;
    ``error`` matches the error class exactly or by
    its last dotted part (``ValueError``, ``PayloadValidationError``); ``fingerprint`` matches a
    whole fingerprint or a prefix of one, as ``deadletters list`` shows it (12 characters);
    ``max_id`` keeps to the rows there were when an operator counted them (ids only grow), so
    what failed since is not acted on unseen.

    Raises AmbiguousFingerprintError when the prefix matches more than one group among the rows
    the other filters select, so a short prefix never acts on more than the operator meant.
    """
    rows = DeadLetter.objects.all()
    if ids is not None:
        rows = rows.filter(pk__in=list(ids))
    if actor:
        rows = rows.filter(actor=actor)
    if task:
        rows = rows.filter(task_path=task)
    if error:
        rows = rows.filter(error_class=error) | rows.filter(error_class__endswith=f".{error}")
    if status:
        rows = rows.filter(status=status)
    if max_id is not None:
        rows = rows.filter(pk__lte=max_id)
    if fingerprint:
        rows = rows.filter(fingerprint__startswith=fingerprint.strip().lower())
        groups = sorted(rows.order_by().values_list("fingerprint", flat=True).distinct()[:_MAX_CANDIDATES])
        if len(groups) > 1:
            raise AmbiguousFingerprintError(fingerprint, groups)
    return rows.order_by("id")


def _require(user: Any, permission: str) -> None:
    # No user means a trusted caller (a shell command run by an operator); a user must hold it.
    if user is not None and not user.has_perm(permission):
        raise PermissionDenied(f"{permission} is required")


def replay_payload(dead_letter: DeadLetter) -> dict[str, Any]:
    """The keyword payload to publish again; positional args (a plain ``actor.send(x)``) are
    named from the job's current signature. Raises PayloadValidationError when they cannot be
    (an older version's: the current signature may order them otherwise), UnknownActorError when
    no such actor is declared any more (a deploy removed it)."""
    payload = dict(dead_letter.payload or {})
    if not dead_letter.args:
        return payload
    declared = configured_broker().actors.get(dead_letter.actor)
    if declared is None:
        raise UnknownActorError(dead_letter.actor)
    versions = declared.options.get(VERSIONS_OPTION)
    published_at = replay_headers(dead_letter)[VERSION_HEADER]
    if versions is not None and published_at != versions.version:
        raise PayloadValidationError(f"positional arguments of {dead_letter.actor} version {published_at!r} "
                                     f"cannot be named by version {versions.version}'s signature")
    fn = declared.fn
    try:
        bound = inspect.signature(fn).bind_partial(*dead_letter.args)
    except TypeError as exc:
        raise PayloadValidationError(f"cannot name the positional arguments of {dead_letter.actor}: {exc}") from None
    overlap = set(bound.arguments) & set(payload)
    if overlap:
        raise PayloadValidationError(f"arguments given twice: {sorted(overlap)}")
    return {**bound.arguments, **payload}


def replay_headers(dead_letter: DeadLetter) -> dict[str, Any]:
    """Headers of the replayed message: the idempotency key of the first message in the chain
    (a replay of a replay keeps the original's), the dead letter it replays, the job version it
    was published at (none: 1), so that it is upgraded as the original would have been, and its
    priority, if it had one."""
    headers = dead_letter.headers if isinstance(dead_letter.headers, dict) else {}
    key = headers.get(IDEMPOTENCY_KEY_HEADER)
    replayed = {IDEMPOTENCY_KEY_HEADER: key if isinstance(key, str) and key else dead_letter.message_id,
                "replay_of": dead_letter.pk, VERSION_HEADER: headers.get(VERSION_HEADER, 1)}
    if headers.get(PRIORITY_HEADER):
        replayed[PRIORITY_HEADER] = headers[PRIORITY_HEADER]
    return replayed


def original_key(dead_letter: DeadLetter) -> str | None:
    """The outbox ``key`` the failed message was published with, so a replay keeps its place in
    that key's order (None for a message sent without one, or straight through Dramatiq)."""
    headers = dead_letter.headers if isinstance(dead_letter.headers, dict) else {}
    key = headers.get("key")
    return key if isinstance(key, str) and key else None


def replay(dead_letter_id: int, *, user: Any = None) -> DeadLetter:
    """Publish the dead letter's message again through the outbox and mark it replayed.

    Raises PermissionDenied (user without ``composition.replay_deadletter``),
    DeadLetter.DoesNotExist, DeadLetterStateError (already replayed or discarded) and whatever
    ``composition.outbox.publish`` raises (unknown actor, payload too large).
    """
    _require(user, REPLAY_PERMISSION)
    with transaction.atomic():
        row = DeadLetter.objects.select_for_update().get(pk=dead_letter_id)
        if row.status != DeadLetter.Status.DEAD:
            raise DeadLetterStateError(row.pk, row.status)
        outbox_message = publish_with_headers(row.actor, replay_payload(row), headers=replay_headers(row),
                                              key=original_key(row))
        row.status = DeadLetter.Status.REPLAYED
        row.replayed_at = timezone.now()
        row.replayed_by = user if user is not None and user.is_authenticated else None
        row.replay_outbox_id = outbox_message.pk
        row.save(update_fields=["status", "replayed_at", "replayed_by", "replay_outbox_id"])
        _resolved(row, outbox_message)
    return row


def discard(dead_letter_id: int, *, user: Any = None) -> DeadLetter:
    """Mark the dead letter discarded (it stays for the record). Raises like ``replay``, with
    ``composition.discard_deadletter`` as the permission."""
    _require(user, DISCARD_PERMISSION)
    with transaction.atomic():
        row = DeadLetter.objects.select_for_update().get(pk=dead_letter_id)
        if row.status != DeadLetter.Status.DEAD:
            raise DeadLetterStateError(row.pk, row.status)
        row.status = DeadLetter.Status.DISCARDED
        row.discarded_at = timezone.now()
        row.discarded_by = user if user is not None and user.is_authenticated else None
        row.save(update_fields=["status", "discarded_at", "discarded_by"])
        _resolved(row, None)
    return row


def _resolved(dead_letter: DeadLetter, replay_row: Any) -> None:
    declared = configured_broker().actors.get(dead_letter.actor)
    hook = declared.options.get(RESOLVED_HOOK_OPTION) if declared is not None else None
    if hook is not None:
        hook(dead_letter, replay_row)


@dataclass
class BulkResult:
    """What a bulk action did: ids done, and ids refused with the reason."""

    done: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)

    def refused_by_reason(self) -> list[tuple[str, list[int]]]:
        """The refused ids grouped by reason, the most common reason first: a thousand rows
        refused for one cause are one line to an operator, not a thousand."""
        by_reason: dict[str, list[int]] = {}
        for pk, reason in self.refused.items():
            by_reason.setdefault(reason, []).append(pk)
        return sorted(by_reason.items(), key=lambda item: -len(item[1]))

    def as_dict(self) -> dict[str, Any]:
        return {"done": self.done, "refused": {str(k): v for k, v in self.refused.items()},
                "done_count": len(self.done), "refused_count": len(self.refused)}


def _bulk(action: Any, rows: QuerySet[DeadLetter], user: Any, permission: str, into: BulkResult | None) -> BulkResult:
    _require(user, permission)
    result = BulkResult() if into is None else into
    for pk in rows.values_list("pk", flat=True):
        try:
            action(pk, user=user)
        except DeadLetterStateError as exc:  # worded without its id, so refusals group by reason
            result.refused[pk] = f"already {exc.status}"
        except DeadLetter.DoesNotExist:
            result.refused[pk] = "no such dead letter"
        except CompositionError as exc:
            result.refused[pk] = str(exc) or type(exc).__name__
        else:
            result.done.append(pk)
    return result


def replay_many(rows: QuerySet[DeadLetter], *, user: Any = None, into: BulkResult | None = None) -> BulkResult:
    """Replay every dead letter in ``rows``, each in its own transaction. The result (``into``,
    else a new one) is filled as it goes: a caller interrupted midway reads what was done."""
    return _bulk(replay, rows, user, REPLAY_PERMISSION, into)


def discard_many(rows: QuerySet[DeadLetter], *, user: Any = None, into: BulkResult | None = None) -> BulkResult:
    """Discard every dead letter in ``rows``, each in its own transaction; ``into`` as for
    ``replay_many``."""
    return _bulk(discard, rows, user, DISCARD_PERMISSION, into)
