"""Admin for dead letters: group by cause, read the traceback, replay or discard.

Rows are read-only; they change only through the replay and discard actions, which need
``composition.replay_deadletter`` / ``composition.discard_deadletter`` (Django hides an action
from a user without its permission, and the service checks again) and a confirmation page that
shows how many dead letters the action will touch.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.html import format_html

from composition.admin.format import moment_column, shortened
from composition.jobs import replay as service
from composition.jobs.failure_groups import failure_groups
from composition.jobs.models import DeadLetter

__all__ = ["DeadLetterAdmin", "FingerprintFilter", "ReadOnlyRows"]

# The fingerprint filter lists the largest groups; a long tail of one-off failures is searchable.
FINGERPRINT_CHOICES = 30
# One click replays or discards at most this many (the oldest first): each is a transaction of
# its own (a few ms), and a web request has a timeout (gunicorn's, a proxy's) that would cut a
# group of a hundred thousand part-way with no report. The next click takes the next ones; the
# command line (``manage.py deadletters``) has no such bound.
BULK_ACTION_LIMIT = 1000
# Refused ids named per reason in the message after an action.
REFUSED_IDS_SHOWN = 10


class ReadOnlyRows:
    """For a ModelAdmin whose rows are only looked at and acted on through actions: no add,
    change or delete, whatever the user's permissions."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class StatusFilter(admin.SimpleListFilter):
    """Open ("dead") letters by default: the replayed and discarded ones are history, and counting
    them in would make a handled incident look unhandled."""

    title = "status"
    parameter_name = "status"
    ALL = "all"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(value), str(label)) for value, label in DeadLetter.Status.choices] + [(self.ALL, "All")]

    def choices(self, changelist: Any) -> Any:
        current = self.value() or DeadLetter.Status.DEAD
        # With the admin's "Show counts" (Django 5+ facets), each status with its count, as
        # Django's own filters show them (its default choices(), replaced here, would).
        counts = self.get_facet_queryset(changelist) if getattr(changelist, "add_facets", False) else {}
        for index, (lookup, title) in enumerate(self.lookup_choices):
            count = counts.get(f"{index}__c")
            yield {"selected": current == lookup, "display": title if count is None else f"{title} ({count})",
                   "query_string": changelist.get_query_string({self.parameter_name: lookup})}

    def queryset(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> QuerySet[DeadLetter]:
        value = self.value() or DeadLetter.Status.DEAD
        return queryset if value == self.ALL else queryset.filter(status=value)


class FingerprintFilter(admin.SimpleListFilter):
    """Failure groups (actor or task + error class + normalised message) with how many dead letters each."""

    title = "fingerprint"
    parameter_name = "fingerprint"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        groups = failure_groups(DeadLetter.objects.filter(status=DeadLetter.Status.DEAD), limit=FINGERPRINT_CHOICES)
        # The message's start too: two groups of one actor and error class differ only there.
        return [(group["fingerprint"],
                 f"{group['task_path'] or group['actor']} · {group['error_class'].rsplit('.', 1)[-1]}: "
                 f"{shortened(group['sample_message'], 50)} ({group['count']})")
                for group in groups]

    def queryset(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> QuerySet[DeadLetter]:
        if self.value():
            return queryset.filter(fingerprint=self.value())
        return queryset

    def choices(self, changelist: Any) -> Any:
        # Django's own, less "Show counts": each group's label has its count already, and the
        # facet would add a second one at the cost of a subquery per group.
        yield {"selected": self.value() is None, "display": "All",
               "query_string": changelist.get_query_string(remove=[self.parameter_name])}
        for lookup, title in self.lookup_choices:
            yield {"selected": self.value() == str(lookup), "display": title,
                   "query_string": changelist.get_query_string({self.parameter_name: lookup})}


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyRows, admin.ModelAdmin):
    # The error's class and message in one column, and moments to the second: the list fits a
    # laptop's admin beside the sidebar without scrolling sideways.
    list_display = ("id", "runs_what", "error", "runs", "status", "last_failed", "short_fingerprint")
    list_filter = (StatusFilter, "actor", "task_path", "error_class", FingerprintFilter)
    search_fields = ("=message_id", "=fingerprint", "task_path", "error_message")
    list_per_page = 100
    actions = ("replay_selected", "discard_selected")
    readonly_fields = ("id", "actor", "task_path", "queue", "message_id", "status", "attempts", "error_class",
                       "error_message", "fingerprint", "pretty_payload", "pretty_args", "pretty_headers",
                       "first_failed", "last_failed", "replayed", "replayed_by", "replay_outbox_id",
                       "discarded", "discarded_by", "pretty_traceback")
    fields = readonly_fields

    def get_list_display(self, request: HttpRequest) -> Any:
        # Filtered to one status (open dead letters by default), its column would repeat it on
        # every row: shown only for "All".
        if request.GET.get(StatusFilter.parameter_name) == StatusFilter.ALL:
            return self.list_display
        return tuple(column for column in self.list_display if column != "status")

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # Replay and discard on the letter's own page, for who may (the confirmation page follows).
        actions = [(action, label) for action, label, allowed in (
            ("replay_selected", "Replay…", self.has_replay_permission(request)),
            ("discard_selected", "Discard…", self.has_discard_permission(request))) if allowed]
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), "letter_actions": actions})

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(service.REPLAY_PERMISSION)

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(service.DISCARD_PERMISSION)

    # -- columns and detail ---------------------------------------------------------------------
    @admin.display(description="actor or task", ordering="actor")
    def runs_what(self, obj: DeadLetter) -> str:
        # A task's actor runs every task of its queue: the task is what failed.
        return obj.task_path or obj.actor

    @admin.display(description="error", ordering="error_class")
    def error(self, obj: DeadLetter) -> str:
        return format_html("<strong>{}</strong> {}", obj.error_class.rsplit(".", 1)[-1],
                           shortened(obj.error_message, 200))

    @admin.display(description="runs", ordering="attempts")
    def runs(self, obj: DeadLetter) -> int:
        return obj.attempts  # how many times it ran, as max_attempts counts

    last_failed = moment_column("last_failed_at", "last failed", sortable=True)
    # The detail's moments to the second too (Django's own display stops at the minute): what
    # happened first is what an incident's timeline needs.
    first_failed = moment_column("first_failed_at", "first failed at")
    replayed = moment_column("replayed_at", "replayed at")
    discarded = moment_column("discarded_at", "discarded at")

    @admin.display(description="fingerprint", ordering="fingerprint")
    def short_fingerprint(self, obj: DeadLetter) -> str:
        return obj.fingerprint[:12]

    @admin.display(description="payload")
    def pretty_payload(self, obj: DeadLetter) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.payload, indent=2, sort_keys=True, ensure_ascii=False))

    @admin.display(description="positional args")
    def pretty_args(self, obj: DeadLetter) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.args, indent=2, ensure_ascii=False))

    @admin.display(description="headers")
    def pretty_headers(self, obj: DeadLetter) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.headers, indent=2, sort_keys=True, ensure_ascii=False))

    @admin.display(description="traceback")
    def pretty_traceback(self, obj: DeadLetter) -> str:
        return format_html("<pre>{}</pre>", obj.traceback)

    # -- actions ------------------------------------------------------------------------------
    def response_action(self, request: HttpRequest, queryset: QuerySet[Any], *args: Any,
                        **kwargs: Any) -> HttpResponse | None:
        # Django's own filters the queryset by the posted ids as they are: one that is not a
        # number (a forged or mangled form) was a 500 from deep inside the ORM.
        try:
            for pk in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
                int(pk)
        except ValueError:
            self.message_user(request, "The selection held something that is not a dead letter's id; nothing was "
                              "done.", messages.ERROR)
            return None
        return super().response_action(request, queryset, *args, **kwargs)

    @admin.action(description="Replay selected dead letters through the outbox", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> HttpResponse | None:
        return self._confirm_then(request, queryset, "replay", service.replay_many)

    @admin.action(description="Discard selected dead letters", permissions=["discard"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> HttpResponse | None:
        return self._confirm_then(request, queryset, "discard", service.discard_many)

    def _confirm_then(self, request: HttpRequest, queryset: QuerySet[DeadLetter], verb: str,
                      act: Any) -> HttpResponse | None:
        selected = queryset.filter(status=DeadLetter.Status.DEAD).order_by("id")
        if request.POST.get("confirm") != "yes":
            count = selected.count()
            batch = list(selected.values_list("pk", flat=True)[:BULK_ACTION_LIMIT])
            context = {
                **self.admin_site.each_context(request),
                "title": f"Confirm {verb}",
                "opts": self.model._meta,
                "verb": verb,
                "action": request.POST.get("action", ""),
                "count": len(batch),
                "matching": count,
                "left_for_later": count - len(batch),
                # The newest id counted: the action keeps to these rows, not to rows that failed
                # while the operator read this page ("select all" re-runs the filter on confirm).
                "upto": batch[-1] if batch else 0,
                "skipped": queryset.count() - count,
                # "All N matching" (select_across) acts on the filtered list, not on ids: a group of
                # ten thousand is not ten thousand hidden inputs (the admin still wants one).
                "ids": [str(pk) for pk in queryset.values_list("pk", flat=True)[
                    :1 if request.POST.get("select_across") == "1" else None]],
                "select_across": request.POST.get("select_across", "0"),
                "groups": (selected.filter(pk__in=batch).values("actor", "task_path", "error_class")
                           .annotate(count=Count("id"))
                           .order_by("-count")[:FINGERPRINT_CHOICES]),
                # Back to the list as the operator left it (a group's filter kept).
                "back_url": request.get_full_path(),
            }
            return TemplateResponse(request, "admin/composition/deadletter/confirm_action.html", context)
        try:
            upto = int(request.POST.get("upto", ""))
        except ValueError:
            self.message_user(request, "The confirmation was incomplete; nothing was done. Try the action again.",
                              messages.ERROR)
            return None
        batch = list(selected.filter(pk__lte=upto).values_list("pk", flat=True)[:BULK_ACTION_LIMIT])
        result = act(DeadLetter.objects.filter(pk__in=batch).order_by("id"), user=request.user)
        if result.done:
            self.message_user(request, f"{verb.capitalize()}ed {len(result.done)} dead letter(s).", messages.SUCCESS)
        if result.done and request.user.pk is not None:
            # In the admin's history too (each letter's, and Recent actions), as an edit would be.
            LogEntry.objects.log_actions(user_id=request.user.pk,
                                         queryset=DeadLetter.objects.filter(pk__in=result.done),
                                         action_flag=CHANGE, change_message=f"{verb.capitalize()}ed from the admin.")
        if not result.done and not batch:
            # A second submit of the same confirmation (a double click, Back and submit again).
            self.message_user(request, f"Nothing to {verb}: the selected dead letters were replayed, discarded "
                              "or deleted already.", messages.INFO)
        for reason, pks in result.refused_by_reason():
            named = ", ".join(str(pk) for pk in pks[:REFUSED_IDS_SHOWN]) + ("…" if len(pks) > REFUSED_IDS_SHOWN else "")
            self.message_user(request, f"{len(pks)} dead letter(s) refused: {reason} (ids {named})", messages.WARNING)
        more = selected.filter(pk__gt=upto).count()
        if more:
            self.message_user(request, f"{more} more open dead letter(s) match this selection (beyond the "
                              f"{BULK_ACTION_LIMIT} one action takes, or failed since); run it again for them.",
                              messages.WARNING)  # work left: not to be read as done
        return None
