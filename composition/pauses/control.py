"""Pausing and resuming: ``pause()``, ``resume()`` and what is paused now (``paused_names``)."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from datetime import datetime
from typing import Any

import structlog
from django.apps import apps
from django.db import transaction
from django.db.models.functions import Now

from composition.pauses.models import Pause

__all__ = ["LINE_BREAKING", "MAX_REASON_CHARS", "PAUSE_PERMISSION", "kept_reason", "pause", "paused_names",
           "resume"]

log = structlog.get_logger("composition.pauses")

# Who may pause and resume from the admin.
PAUSE_PERMISSION = "composition.change_pauses"
# Unicode's control characters (a newline, a tab) and line and paragraph separators.
LINE_BREAKING = frozenset({"Cc", "Zl", "Zp"})
# A reason is a line on the operations page and in `queues list`, not a document.
MAX_REASON_CHARS = 500


def _kind(kind: str) -> str:
    if kind not in dict(Pause.KINDS):
        raise ValueError(f"kind must be one of {sorted(dict(Pause.KINDS))}, got {kind!r}")
    return kind


def _change(kind: str, name: str, *, paused: bool, by: str, reason: str, user: Any,
            shed: bool, keep_start: Callable[[datetime], bool] | None = None) -> tuple[Pause | None, bool]:
    longest = Pause._meta.get_field("changed_by").max_length or 0
    if len(by) > longest:
        raise ValueError(f"who paused or resumed is at most {longest} characters, got {len(by)}")
    if len(reason) > MAX_REASON_CHARS:
        raise ValueError(f"a reason is at most {MAX_REASON_CHARS} characters, got {len(reason)}")
    if any(unicodedata.category(character) in LINE_BREAKING for character in reason):
        # A newline split the row of `queues list` in two, its second half under no column. A
        # no-break space or an emoji's joiner is text (isprintable() refused them too).
        raise ValueError(f"a reason is one line of text, without a newline or other control character: {reason!r:.80}")
    with transaction.atomic():
        row = Pause.objects.select_for_update().filter(kind=_kind(kind), name=name).first()
        if row is None and not paused:
            return None, False  # never paused: nothing to resume, nothing to record
        if shed and not paused and row is not None and not row.shed:
            return row, False  # the controller resumes only its own pauses, never an operator's
        if row is None:
            # The first pause of this name (the unique constraint settles two at once).
            row, changed = Pause.objects.get_or_create(kind=kind, name=name, defaults={
                "paused": True, "changed_by": by, "reason": reason, "changed_at": Now(), "paused_at": Now(),
                "shed": shed})
            if not changed:
                row = Pause.objects.select_for_update().get(pk=row.pk)
        else:
            changed = False
        # An operator pausing what the shedding controller paused makes it theirs (it then
        # stays paused when the pressure ends).
        if not changed and (row.paused != paused or (paused and row.shed and not shed)):
            fields = ["paused", "changed_by", "reason", "changed_at", "shed"]
            # A pause begins; a resume keeps its start (a schedule's ticks between are paused).
            if paused and not row.paused and not (keep_start is not None and keep_start(row.changed_at)):
                row.paused_at = Now()
                fields.append("paused_at")
            row.paused, row.changed_by, row.reason, row.changed_at, row.shed = paused, by, reason, Now(), shed
            row.save(update_fields=fields)
            changed = True
        if changed:
            row.refresh_from_db(fields=["changed_at", "paused_at"])
            if user is not None and apps.is_installed("django.contrib.admin"):
                from django.contrib.admin.models import CHANGE, LogEntry  # an API-only project has no admin

                # The admin's history of the row: who did what, as for any admin change.
                action = "Paused" if paused else "Resumed"
                LogEntry.objects.log_actions(user.pk, [row], CHANGE,
                                             change_message=f"{action}{': ' + reason if reason else ''}",
                                             single_object=True)
    if changed:
        event = ("shed" if paused else "unshed") if shed else ("paused" if paused else "resumed")
        log.warning(f"{kind} {event}", kind=kind, name=name, by=by, reason=reason)
    return row, changed


def pause(kind: str, name: str, *, by: str, reason: str = "", user: Any = None,
          shed: bool = False, keep_start: Callable[[datetime], bool] | None = None) -> tuple[Pause, bool]:
    """Pause ``name`` of ``kind`` (``Pause.SCHEDULE`` or ``Pause.QUEUE``) for every host, durably.

    ``by`` says who, on the row and in the log; with a ``user`` (a Django user) the change is in
    the admin's history of the row too; ``shed`` marks the shedding controller's pause;
    ``keep_start(resumed_at)``, called under the row's lock when a resumed row is paused again,
    True keeps the earlier pause's start (``paused_at``: ``pause_schedule`` does). Returns
    the row and whether this call changed it (False: it was paused already). Raises ValueError
    for an unknown kind, a ``by`` over 150 characters or a ``reason`` over ``MAX_REASON_CHARS``."""
    row, changed = _change(kind, name, paused=True, by=by, reason=reason, user=user, shed=shed,
                           keep_start=keep_start)
    assert row is not None  # a pause always has its row
    return row, changed


def resume(kind: str, name: str, *, by: str, reason: str = "", user: Any = None,
           shed: bool = False) -> tuple[Pause | None, bool]:
    """Undo ``pause()``; the row (None when it was never paused) and whether this call changed it."""
    return _change(kind, name, paused=False, by=by, reason=reason, user=user, shed=shed)


def paused_names(kind: str) -> frozenset[str]:
    """The names of ``kind`` paused now."""
    return frozenset(Pause.objects.filter(kind=_kind(kind), paused=True).values_list("name", flat=True))


def kept_reason(pause: Pause, given: str) -> str:
    """What a pause of something paused already says of a reason it did not record."""
    if not given or given == pause.reason:
        return ""
    return (f" (by {pause.changed_by}: {pause.reason or 'no reason'}); the new reason is not recorded: "
            "resume and pause again to change it")
