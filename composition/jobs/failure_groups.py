"""Dead letters counted per failure group (one fingerprint: actor, error class and normalised
message), largest first: what ``deadletters list``, the admin and the operations page show."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Max, QuerySet

from composition.jobs.models import DeadLetter

__all__ = ["failure_groups"]


def failure_groups(rows: QuerySet[DeadLetter], *, limit: int | None = None) -> list[dict[str, Any]]:
    """``rows`` grouped by fingerprint: ``fingerprint``, ``actor``, ``error_class``, ``count``
    ``last_failed_at`` (a datetime) and ``latest_id`` (one of its dead letters, for a form that
    acts on the whole group), largest group first; one query."""
    grouped = (rows.values("fingerprint", "actor", "error_class")
               .annotate(count=Count("id"), last_failed_at=Max("last_failed_at"), latest_id=Max("id"))
               .order_by("-count", "fingerprint"))
    rows_of_groups: Any = grouped[:limit] if limit is not None else grouped
    return list(rows_of_groups)
