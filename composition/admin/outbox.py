"""Read-only admin for the outbox: what is pending, since when, and what each message carried."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html

from composition.admin.format import moment, moment_column, shortened
from composition.outbox.maintenance import pending_summary
from composition.outbox.models import OutboxMessage

__all__ = ["OutboxMessageAdmin"]


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):
    """Operators look, they do not edit: a row changes only through publish and the relay."""

    # Sent time and lease share one column: a row has one or the other, and the list then fits
    # a laptop's admin without scrolling sideways.
    list_display = ("id", "actor_name", "key", "status", "created", "delivery", "attempts")
    list_filter = ("status", "actor_name")
    search_fields = ("=id", "key")
    list_per_page = 100
    # The changelist count of a large outbox is a slow full count; the pending summary above the
    # list uses the small partial index instead.
    show_full_result_count = False
    readonly_fields = ("id", "actor_name", "queue_name", "key", "status", "message_id", "pretty_payload",
                       "pretty_headers", "delay_s", "created_at", "due_at", "claimed_until", "claimed_by", "attempts",
                       "sent_at", "last_error")
    fields = readonly_fields

    created = moment_column("created_at", "created at", sortable=True)

    @admin.display(description="sent / lease", ordering="sent_at")
    def delivery(self, obj: OutboxMessage) -> str:
        """When it was sent; for a pending row, the relay lease it is under, or that it waits
        (with its last error, when a send failed)."""
        if obj.sent_at is not None:
            return moment(obj.sent_at)
        if obj.status == OutboxMessage.Status.HELD and obj.due_at is not None:
            return f"held until {moment(obj.due_at)}"
        if obj.claimed_until is not None and obj.claimed_until > timezone.now():
            return f"leased until {moment(obj.claimed_until)}"
        if obj.last_error:
            return format_html('<span title="{}">waiting, last error: {}</span>', obj.last_error,
                               shortened(obj.last_error, 60))
        return "waiting for the relay"

    @admin.display(description="payload")
    def pretty_payload(self, obj: OutboxMessage) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.payload, indent=2, sort_keys=True, ensure_ascii=False))

    @admin.display(description="headers")
    def pretty_headers(self, obj: OutboxMessage) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.headers, indent=2, sort_keys=True, ensure_ascii=False))

    @admin.display(description="Dramatiq message id")
    def message_id(self, obj: OutboxMessage) -> str:
        return obj.message_id

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        pending, age_s = pending_summary()
        # Shown under the heading and at the head of the browser tab's title (Django's admin
        # puts a subtitle there), so it names what it counts.
        subtitle = f"Outbox: {pending} pending"
        if pending:
            subtitle += f" · oldest pending {age_s:.1f} s ago"
        context = {"subtitle": subtitle, "outbox_pending": pending, "outbox_oldest_pending_age_s": age_s}
        return super().changelist_view(request, {**context, **(extra_context or {})})

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: OutboxMessage | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: OutboxMessage | None = None) -> bool:
        return False
