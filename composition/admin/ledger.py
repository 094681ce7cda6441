"""The inbox ledger in the admin, read-only: "did message X run, when, where?" at 3 a.m., by the
message id a log line, a dead letter or the broker names, without a database shell.

The ledger holds a row per idempotent job run, millions of them on a busy system, so the list
does no full count: the search is by exact message id (its unique index answers), the order is
by ``processed_at`` (its index), and the unfiltered list's size is PostgreSQL's estimate.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connections

from composition.admin.dead_letters import ReadOnlyRows
from composition.admin.format import moment_column
from composition.jobs.models import ProcessedMessage

__all__ = ["ProcessedMessageAdmin"]


class EstimatedCountPaginator(Paginator):
    """Django's paginator, counting an unfiltered list by the planner's estimate instead of a scan
    of every row; a search is counted exactly (it matches a row or none). An estimate under
    ``EXACT_UP_TO`` is checked by a count that stops there: a stale one (the table grew since it
    was last analysed) under a page's size would make the changelist load every row on one page."""

    EXACT_UP_TO = 10_000

    @cached_property
    def count(self) -> int:
        queryset: Any = self.object_list
        if getattr(queryset, "query", None) is None or queryset.query.where:
            return super().count
        with connections[queryset.db].cursor() as cursor:
            cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                           [queryset.model._meta.db_table])
            row = cursor.fetchone()
        # -1 (or nothing) until the table was first analysed.
        estimate = int(row[0]) if row is not None else -1
        if estimate >= self.EXACT_UP_TO:
            return estimate
        return int(queryset.order_by()[:self.EXACT_UP_TO + 1].count())


@admin.register(ProcessedMessage)
class ProcessedMessageAdmin(ReadOnlyRows, admin.ModelAdmin):
    list_display = ("message_id", "actor", "processed")
    search_fields = ("=message_id",)
    search_help_text = "The message id, exactly (a dead letter's, a log line's, the broker's)."
    ordering = ("-processed_at",)
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    fields = ("message_id", "actor", "processed")
    readonly_fields = fields

    processed = moment_column("processed_at", "processed at", sortable=True)
