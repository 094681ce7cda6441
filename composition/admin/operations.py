"""The operations page in the admin: one screen for the night a queue piles up (see
``composition.operations.snapshot`` for where each figure comes from). It refreshes itself with a meta
refresh, every ``REFRESH_S`` seconds unless paused: no JavaScript."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from composition.admin.dead_letters import ReadOnlyRows
from composition.jobs.replay import REPLAY_PERMISSION
from composition.operations.models import Operations
from composition.operations.snapshot import operations_snapshot

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
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/composition/operations.html", context)
