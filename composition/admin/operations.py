"""The operations page in the admin: one screen for the night a queue piles up (see
``composition.operations.snapshot`` for where each figure comes from). It refreshes itself with a meta
refresh, every ``REFRESH_S`` seconds unless paused: no JavaScript."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from composition.admin.dead_letters import ReadOnlyRows
from composition.jobs.replay import REPLAY_PERMISSION
from composition.operations.models import Operations
from composition.operations.snapshot import operations_snapshot
from composition.pauses import PAUSE_PERMISSION, Pause, pause, resume
from composition.schedules import declared

__all__ = ["OperationsAdmin"]

REFRESH_S = 5


@admin.register(Operations)
class OperationsAdmin(ReadOnlyRows, admin.ModelAdmin):
    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        paused = request.GET.get("refresh") == "off"
        dead_letters = reverse("admin:composition_deadletter_changelist")
        context = {
            **self.admin_site.each_context(request),
            "title": "Operations",
            "opts": self.model._meta,
            "snapshot": operations_snapshot(),
            "refresh_s": None if paused else REFRESH_S,
            "dead_letters_url": dead_letters,
            # Replay buttons only for who may replay (the action would refuse the others anyway).
            "can_replay": request.user.has_perm(REPLAY_PERMISSION),
            "can_pause": request.user.has_perm(PAUSE_PERMISSION),
            "schedule_url": reverse("admin:composition_operations_schedule"),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/composition/operations.html", context)

    def get_urls(self) -> list[URLPattern]:
        own = [path("schedule/", self.admin_site.admin_view(self.schedule_view),
                    name="composition_operations_schedule")]
        return own + super().get_urls()

    def schedule_view(self, request: HttpRequest) -> HttpResponse:
        """Pause or resume a schedule (POST ``name``, ``action``, ``reason``), for every host; the
        change goes in the admin's history of its ``Pause`` row."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not request.user.has_perm(PAUSE_PERMISSION):
            raise PermissionDenied
        name, action = request.POST.get("name", ""), request.POST.get("action")
        page = reverse("admin:composition_operations_changelist")
        if name not in declared() or action not in ("pause", "resume"):
            messages.error(request, f"No schedule {name!r} to {action or 'change'}.")
            return HttpResponseRedirect(page)
        change = pause if action == "pause" else resume
        _, changed = change(Pause.SCHEDULE, name, by=request.user.get_username(),
                            reason=request.POST.get("reason", "").strip()[:500], user=request.user)
        done = "paused" if action == "pause" else "resumed"
        messages.success(request, f"Schedule {name} {done}." if changed else f"Schedule {name} was {done} already.")
        return HttpResponseRedirect(page)
