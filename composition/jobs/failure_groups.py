"""Dead letters counted per failure group (one fingerprint: actor, and task for a task's letter,
error class and normalised message), largest first: what ``deadletters list``, the admin and the
operations page show."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Max, QuerySet
from django.db.models.functions import Left

from composition.jobs.models import DeadLetter

__all__ = ["SAMPLE_CHARS", "failure_groups", "group_count"]

# How much of a group's error message is carried as its sample.
SAMPLE_CHARS = 200


def failure_groups(rows: QuerySet[DeadLetter], *, limit: int | None = None) -> list[dict[str, Any]]:
    """``rows`` grouped by fingerprint: ``fingerprint``, ``actor``, ``task_path`` (a task's letters;
    "" for a job's), ``error_class``, ``count``
    ``last_failed_at`` (a datetime), ``latest_id`` (one of its dead letters, for a form that
    acts on the whole group) and ``sample_message`` (the start of one of their error messages:
    two groups of one actor and error class differ there), largest group first; one query."""
    grouped = (rows.values("fingerprint", "actor", "task_path", "error_class")
               .annotate(count=Count("id"), last_failed_at=Max("last_failed_at"), latest_id=Max("id"),
                         sample_message=Max(Left("error_message", SAMPLE_CHARS)))
               .order_by("-count", "fingerprint"))
    rows_of_groups: Any = grouped[:limit] if limit is not None else grouped
    return list(rows_of_groups)


def group_count(rows: QuerySet[DeadLetter]) -> int:
    """How many failure groups ``rows`` fall into (one query)."""
    return int(rows.values("fingerprint").distinct().count())
