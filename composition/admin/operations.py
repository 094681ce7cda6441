"""The operations page in the admin: one screen for the night a queue piles up (see
``composition.operations.snapshot`` for where each figure comes from). It reloads itself with a meta
refresh, every ``REFRESH_S`` seconds unless turned off (``?refresh=off``): no JavaScript. Who may
pause pauses and resumes queues and schedules from it, and purges a paused queue after a
confirmation page; a pause's reason is typed on the page with its reload off, which a reload
would otherwise wipe."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from composition.admin.charts import latest, queue_chart
from composition.admin.dead_letters import ReadOnlyRows
from composition.broker.purging import NotPurgeable
from composition.conf import conf
from composition.errors import BROKER_FAILURES, described
from composition.jobs.replay import REPLAY_PERMISSION
from composition.operations.models import Operations
from composition.operations.snapshot import operations_snapshot
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.pauses import PAUSE_PERMISSION, Pause, kept_reason, paused_names
from composition.queues import (
    QueueNotPausable,
    QueueNotPaused,
    pause_queue,
    purge_queue,
    resume_queue,
    waiting_to_purge,
)
from composition.queues.history import HISTORY_BUCKETS
from composition.schedules import declared, pause_schedule, resume_schedule

__all__ = ["OperationsAdmin"]

REFRESH_S = 5


@admin.register(Operations)
class OperationsAdmin(ReadOnlyRows, admin.ModelAdmin):
    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        reload_off = request.GET.get("refresh") == "off"
        dead_letters = reverse("admin:composition_deadletter_changelist")
        snapshot = operations_snapshot()
        context = {
            **self.admin_site.each_context(request),
            "title": "Operations",
            # A wide dashboard: without the admin's side menu its tables fit a laptop's screen.
            "is_nav_sidebar_enabled": False,
            "opts": self.model._meta,
            "snapshot": snapshot,
            "charts": [(name, queue_chart(name, buckets), latest(buckets))
                       for name, buckets in snapshot.history.items()],
            "bucket_s": float(conf.QUEUE_HISTORY_BUCKET_S),
            "history_minutes": HISTORY_BUCKETS * float(conf.QUEUE_HISTORY_BUCKET_S) / 60,
            "refresh_s": None if reload_off else REFRESH_S,
            "default_refresh_s": REFRESH_S,
            "dead_letters_url": dead_letters,
            # Replay buttons only for who may replay (the action would refuse the others anyway).
            "can_replay": request.user.has_perm(REPLAY_PERMISSION),
            # A failure's text may quote a payload (an address, a name): only for who may read the
            # dead letters themselves; the others see the counts, and no links that answer 403.
            "can_view_dead_letters": request.user.has_perm("composition.view_deadletter"),
            "can_pause": request.user.has_perm(PAUSE_PERMISSION),
            "schedule_url": reverse("admin:composition_operations_schedule"),
            "queue_url": reverse("admin:composition_operations_queue"),
            "purge_url": reverse("admin:composition_operations_purge"),
            "relay_queue": RELAY_QUEUE_NAME,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/composition/operations.html", context)

    def get_urls(self) -> list[URLPattern]:
        # The page and its two forms only: Operations is a proxy of DeadLetter, so ModelAdmin's
        # per-row pages (change, history, ...) would show a dead letter in full to who may see
        # this page but not the dead letters.
        return [path("", self.admin_site.admin_view(self.changelist_view), name="composition_operations_changelist"),
                path("schedule/", self.admin_site.admin_view(self.schedule_view),
                     name="composition_operations_schedule"),
                path("queue/", self.admin_site.admin_view(self.queue_view), name="composition_operations_queue"),
                path("purge/", self.admin_site.admin_view(self.purge_view), name="composition_operations_purge")]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_view_permission(request)

    def schedule_view(self, request: HttpRequest) -> HttpResponse:
        """Pause or resume a schedule (POST ``name``, ``action``, ``reason``) for every host."""

        def change(action: str, name: str, **who: Any) -> bool:
            # A paused schedule no code declares any more is listed, and its pause can be lifted.
            if name not in declared() and (action == "pause" or name not in paused_names(Pause.SCHEDULE)):
                raise PauseRefused(f"No schedule {name!r} to {action}.")
            return (pause_schedule if action == "pause" else resume_schedule)(name, **who)[1]

        return self._pause_view(request, "Schedule", change)

    def queue_view(self, request: HttpRequest) -> HttpResponse:
        """Pause or resume a queue (POST ``name``, ``action``, ``reason``) for every worker host."""

        def change(action: str, name: str, **who: Any) -> bool:
            try:
                return (pause_queue if action == "pause" else resume_queue)(name, **who)[1]
            except QueueNotPausable as exc:
                raise PauseRefused(str(exc)) from exc

        return self._pause_view(request, "Queue", change)

    def purge_view(self, request: HttpRequest) -> HttpResponse:
        """GET ``name``: what a purge of the paused queue would take, and a form to confirm it;
        POST ``name``, ``reason``: the purge (``composition.queues.purge_queue``), for who may pause."""
        if not request.user.has_perm(PAUSE_PERMISSION):
            raise PermissionDenied
        name = (request.POST if request.method == "POST" else request.GET).get("name", "")
        page = reverse("admin:composition_operations_changelist") + "?refresh=off"
        try:
            if request.method != "POST":
                waiting = waiting_to_purge(name)
                paused = Pause.objects.filter(kind=Pause.QUEUE, name=name, paused=True).first()
                return TemplateResponse(request, "admin/composition/operations_purge.html", {
                    **self.admin_site.each_context(request), "title": f"Purge queue {name}?", "opts": self.model._meta,
                    "waiting": waiting, "paused": paused, "back_url": page})
            result = purge_queue(name, by=request.user.get_username(), reason=request.POST.get("reason", "").strip(),
                                 user=request.user)
        except (QueueNotPausable, QueueNotPaused, NotPurgeable) as exc:
            messages.error(request, str(exc))
            return HttpResponseRedirect(page)
        except BROKER_FAILURES as exc:
            # What a purge took before the broker failed is recorded; the rest waits as it did.
            messages.error(request, f"The broker did not answer ({described(exc)}): nothing more was purged; "
                                    "what was taken before is in the dead letters. Purge again once it answers.")
            return HttpResponseRedirect(page)
        held = f" {result.held_by_workers} held by workers were left." if result.held_by_workers else ""
        messages.success(request, f"Queue {name} purged: {result.purged} dead letters ({result.from_outbox} from the "
                                  f"outbox, {result.from_broker} from the broker), error class Purged.{held}")
        return HttpResponseRedirect(page)

    def _pause_view(self, request: HttpRequest, what: str, change: Callable[..., bool]) -> HttpResponse:
        """A POST of ``name``, ``action`` (pause or resume) and ``reason`` from the page, for who
        may pause; the change goes in the admin's history of its ``Pause`` row."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not request.user.has_perm(PAUSE_PERMISSION):
            raise PermissionDenied
        name, action = request.POST.get("name", ""), request.POST.get("action", "")
        page = reverse("admin:composition_operations_changelist")
        if request.POST.get("refresh") == "off":  # back as it was: a page that does not reload
            page += "?refresh=off"
        reason = request.POST.get("reason", "").strip()
        try:
            if action not in ("pause", "resume"):
                raise PauseRefused(f"No action {action!r} for {what.lower()} {name!r}.")
            changed = change(action, name, by=request.user.get_username(), reason=reason, user=request.user)
        except PauseRefused as exc:
            messages.error(request, str(exc))
            return HttpResponseRedirect(page)
        except ValueError as exc:  # a reason too long: it was cut without a word
            messages.error(request, f"{str(exc)[:1].upper()}{str(exc)[1:]}; nothing was changed.")
            return HttpResponseRedirect(page)
        if changed:
            messages.success(request, f"{what} {name} {'paused' if action == 'pause' else 'resumed'}.")
        elif action == "resume":
            messages.success(request, f"{what} {name} was not paused.")  # as the command says
        else:
            # A new reason is not recorded: said, as the command says it, not dropped without a word.
            row = Pause.objects.filter(kind=Pause.QUEUE if what == "Queue" else Pause.SCHEDULE, name=name).first()
            messages.success(request, f"{what} {name} was paused already"
                             + (kept_reason(row, reason) if row is not None else "") + ".")
        return HttpResponseRedirect(page)


class PauseRefused(Exception):
    """What the page says when a pause or resume cannot be done."""
