"""Pauses in the admin, read-only: what is paused, by whom, since when and why, each row with its
history (every pause and resume made from the operations page, or by a named user on the
command line). Pausing and resuming are on the operations page, for who may."""

from __future__ import annotations

from django.contrib import admin

from composition.admin.dead_letters import ReadOnlyRows
from composition.pauses import Pause

__all__ = ["PauseAdmin"]


@admin.register(Pause)
class PauseAdmin(ReadOnlyRows, admin.ModelAdmin):
    list_display = ("kind", "name", "paused", "shed", "changed_by", "changed_at", "reason")
    list_filter = ("kind", "paused", "shed")
    search_fields = ("name",)
    ordering = ("kind", "name")
    readonly_fields = list_display
    fields = list_display
