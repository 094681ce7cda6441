"""Admin for the outbox: what is pending, since when, and what each message carried; rows change
only through publish and the relay, but for the one action, cancelling jobs not yet sent."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html

from composition.admin.format import moment, moment_column, shortened
from composition.outbox.cancel import cancel
from composition.outbox.maintenance import pending_summary
from composition.outbox.models import OutboxMessage

__all__ = ["CANCEL_LIMIT", "CANCEL_PERMISSION", "OutboxMessageAdmin"]

# Jobs one click cancels, the oldest first (a row at a time, each in its own transaction); the
# command line (``manage.py outbox cancel``) takes ids with no bound.
CANCEL_LIMIT = 1000
# Cancelling deletes the row: Django's own permission for that, with no Delete button beside it.
CANCEL_PERMISSION = "composition.delete_outboxmessage"


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):
    """Operators look, they do not edit: a row changes only through publish and the relay, or
    goes when its job is cancelled."""

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

    actions = ["cancel_selected"]
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

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(CANCEL_PERMISSION)

    @admin.action(description="Cancel selected jobs not yet sent", permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> HttpResponse | None:
        # What cancel() takes: rows no relay has claimed (the others may be on the broker).
        unsent = queryset.filter(status__in=[OutboxMessage.Status.PENDING, OutboxMessage.Status.HELD],
                                 attempts=0).order_by("id")
        if request.POST.get("confirm") != "yes":
            batch = list(unsent.values_list("pk", flat=True)[:CANCEL_LIMIT])
            matching = unsent.count()
            across = request.POST.get("select_across") == "1"
            context = {
                **self.admin_site.each_context(request),
                "title": "Confirm cancel", "opts": self.model._meta, "action": request.POST.get("action", ""),
                "count": len(batch), "matching": matching, "left_for_later": matching - len(batch),
                # Of the rows ticked; "select all" is not counted: that would be the whole table.
                "skipped": 0 if across else queryset.count() - matching,
                "jobs": (unsent.filter(pk__in=batch).values("actor_name").annotate(count=Count("id"))
                         .order_by("-count", "actor_name")),
                # The ids counted, as hidden inputs even for "select all": a job published while the
                # operator reads this page is not cancelled by the filter's second run.
                "ids": [str(pk) for pk in batch], "select_across": "0",
                "back_url": request.get_full_path(),
            }
            return TemplateResponse(request, "admin/composition/outboxmessage/confirm_cancel.html", context)
        cancelled = 0
        for row in unsent[:CANCEL_LIMIT]:
            with transaction.atomic():
                if not cancel(row):
                    continue
                cancelled += 1
                if request.user.pk is not None:
                    # In the admin's Recent actions with its payload (the row's own history page
                    # is gone with it); the entry's message keeps the payload whole.
                    payload = json.dumps(row.payload, sort_keys=True, ensure_ascii=False)
                    LogEntry.objects.create(
                        user_id=request.user.pk, content_type=ContentType.objects.get_for_model(OutboxMessage),
                        object_id=str(row.pk), action_flag=DELETION,
                        object_repr=f"cancelled: outbox #{row.pk} {row.actor_name} {payload}"[:200],
                        change_message=f"Cancelled from the admin: {row.actor_name} {payload}")
        missed = queryset.count()  # what is left of the selection: rows a relay claimed
        if cancelled:
            self.message_user(request, f"Cancelled {cancelled} job(s).", messages.SUCCESS)
        if missed:
            self.message_user(request, f"{missed} selected job(s) not cancelled: a relay has sent them or tried "
                              "to (they may be on the broker).", messages.WARNING)
        if not cancelled and not missed:  # a second submit of the same confirmation
            self.message_user(request, "Nothing to cancel: the selected jobs were cancelled already.", messages.INFO)
        return None
