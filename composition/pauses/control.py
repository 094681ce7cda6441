"""Pausing and resuming: ``pause()``, ``resume()`` and what is paused now (``paused_names``)."""

from __future__ import annotations

from typing import Any

import structlog
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import transaction
from django.db.models.functions import Now

from composition.pauses.models import Pause

__all__ = ["PAUSE_PERMISSION", "pause", "paused_names", "resume"]

log = structlog.get_logger("composition.pauses")

# Who may pause and resume from the admin.
PAUSE_PERMISSION = "composition.change_pauses"


def _kind(kind: str) -> str:
    if kind not in dict(Pause.KINDS):
        raise ValueError(f"kind must be one of {sorted(dict(Pause.KINDS))}, got {kind!r}")
    return kind


def _change(kind: str, name: str, *, paused: bool, by: str, reason: str, user: Any) -> tuple[Pause, bool]:
    with transaction.atomic():
        row, _ = Pause.objects.select_for_update().get_or_create(
            kind=_kind(kind), name=name,
            defaults={"paused": not paused, "changed_by": by, "changed_at": Now()})
        changed = row.paused != paused
        if changed:
            row.paused, row.changed_by, row.reason, row.changed_at = paused, by, reason, Now()
            row.save(update_fields=["paused", "changed_by", "reason", "changed_at"])
            row.refresh_from_db(fields=["changed_at"])
            if user is not None:
                # The admin's history of the row: who did what, as for any admin change.
                action = "Paused" if paused else "Resumed"
                LogEntry.objects.log_actions(user.pk, [row], CHANGE,
                                             change_message=f"{action}{': ' + reason if reason else ''}",
                                             single_object=True)
    if changed:
        log.warning(f"{kind} {'paused' if paused else 'resumed'}", kind=kind, name=name, by=by, reason=reason)
    return row, changed


def pause(kind: str, name: str, *, by: str, reason: str = "", user: Any = None) -> tuple[Pause, bool]:
    """Pause ``name`` of ``kind`` (``Pause.SCHEDULE`` or ``Pause.QUEUE``) for every host, durably.

    ``by`` says who, on the row and in the log; with a ``user`` (a Django user) the change is in
    the admin's history of the row too. Returns the row and whether this call changed it (False:
    it was paused already)."""
    return _change(kind, name, paused=True, by=by, reason=reason, user=user)


def resume(kind: str, name: str, *, by: str, reason: str = "", user: Any = None) -> tuple[Pause, bool]:
    """Undo ``pause()``; the row and whether this call changed it."""
    return _change(kind, name, paused=False, by=by, reason=reason, user=user)


def paused_names(kind: str) -> frozenset[str]:
    """The names of ``kind`` paused now."""
    return frozenset(Pause.objects.filter(kind=_kind(kind), paused=True).values_list("name", flat=True))
