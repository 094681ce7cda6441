"""How ``manage.py deadletters`` reads on a terminal and as JSON: the failure groups first, then
the newest letters (``list``), or every field of a letter (``show``)."""

from __future__ import annotations

import json
from typing import Any

from django.db.models import QuerySet

from composition.jobs.failure_groups import failure_groups
from composition.jobs.models import DeadLetter

__all__ = ["LIST_GROUPS", "LIST_LIMIT", "detail", "detail_lines", "listing", "listing_lines"]

LIST_LIMIT = 200
LIST_GROUPS = 50
# Shown as JSON in the plain output too, so that they can be pasted where JSON is read.
_JSON_FIELDS = ("payload", "args", "headers")


def _summary(row: DeadLetter) -> dict[str, Any]:
    return {"id": row.pk, "actor": row.actor, "task_path": row.task_path, "status": row.status,
            "attempts": row.attempts,
            "error_class": row.error_class, "error_message": row.error_message,
            "fingerprint": row.fingerprint, "message_id": row.message_id,
            "last_failed_at": row.last_failed_at.isoformat()}


def _runs(row: dict[str, Any]) -> str:
    """What a letter (or group) of the plain output ran: its task, for a task's, else its actor."""
    return str(row["task_path"] or row["actor"])


def listing(rows: QuerySet[DeadLetter]) -> dict[str, Any]:
    """``list --json``: the count, the largest groups and the newest letters of ``rows``."""
    groups = [{**group, "last_failed_at": group["last_failed_at"].isoformat()}
              for group in failure_groups(rows, limit=LIST_GROUPS)]
    group_count = rows.values("fingerprint").distinct().count() if len(groups) == LIST_GROUPS else len(groups)
    shown = [_summary(row) for row in rows.order_by("-last_failed_at", "-id")[:LIST_LIMIT]]
    return {"count": rows.count(), "group_count": group_count, "groups": groups, "dead_letters": shown}


def listing_lines(found: dict[str, Any]) -> list[str]:
    """``list``'s plain lines of a ``listing``."""
    total, group_count, groups, shown = found["count"], found["group_count"], found["groups"], found["dead_letters"]
    lines = []
    # The groups first: at 3 a.m. "one bug, 4,000 letters" matters more than the letters.
    if groups:
        lines.append(f"{'COUNT':<7} {'FINGERPRINT':<12}  {'ACTOR OR TASK':<30} {'ERROR':<28} "
                     f"{'LAST FAILED':<37} SAMPLE MESSAGE")
    for group in groups:
        # The sample tells apart groups of one actor and error class (a fingerprint does not, to a reader).
        lines.append(f"x{group['count']:<6} {group['fingerprint'][:12]}  {_runs(group):<30} "
                     f"{group['error_class'].rsplit('.', 1)[-1]:<28} last {group['last_failed_at']:<32} "
                     f"{' '.join(group['sample_message'].split())[:60]}")
    if groups:
        lines.append("")
    if shown:
        lines.append(f"{'ID':>8}  {'STATUS':<9} {'ACTOR OR TASK':<30} {'ERROR':<28} {'RUNS':<4} "
                     f"{'FINGERPRINT':<12}  MESSAGE")
    for row in shown:
        lines.append(f"{row['id']:>8}  {row['status']:<9} {_runs(row):<30} "
                     f"{row['error_class'].rsplit('.', 1)[-1]:<28} x{row['attempts']:<3} "
                     f"{row['fingerprint'][:12]}  {' '.join(row['error_message'].split())[:80]}")
    lines.append(f"{total} dead letter(s)" + (f", newest {LIST_LIMIT} shown" if total > LIST_LIMIT else "")
                 + (f"; {group_count} groups, largest {LIST_GROUPS} shown" if group_count > len(groups) else ""))
    return lines


def detail(row: DeadLetter) -> dict[str, Any]:
    """``show --json``: every field of one letter (``replayed_by``/``discarded_by`` selected)."""
    return {**_summary(row), "queue": row.queue, "payload": row.payload, "args": row.args,
            "headers": row.headers, "first_failed_at": row.first_failed_at.isoformat(),
            "replayed_at": row.replayed_at.isoformat() if row.replayed_at else None,
            "replayed_by": row.replayed_by.get_username() if row.replayed_by else None,
            "replay_outbox_id": row.replay_outbox_id,
            "discarded_at": row.discarded_at.isoformat() if row.discarded_at else None,
            "discarded_by": row.discarded_by.get_username() if row.discarded_by else None,
            "traceback": row.traceback}


def detail_lines(row: DeadLetter) -> list[str]:
    """``show``'s plain lines of one letter, its traceback last."""
    lines = []
    for name, value in detail(row).items():
        if name in _JSON_FIELDS:
            lines.append(f"{name}: {json.dumps(value, ensure_ascii=False, sort_keys=True)}")
        elif name != "traceback":
            lines.append(f"{name}: {value}")
    return [*lines, row.traceback]
