"""The ``Pause`` model: one row per schedule or queue that was ever paused."""

from __future__ import annotations

from django.db import models


class Pause(models.Model):
    """Whether ``name`` of ``kind`` is paused; the last change's author, time and reason.

    A resume keeps the row (``paused`` False), so the page and ``list`` can say who resumed it
    and when; the admin's history keeps every change made there. ``shed`` marks a change made by
    the shedding controller (``composition.queues.shedding``): it resumes only what it paused,
    and an operator's change takes the mark off."""

    SCHEDULE = "schedule"
    QUEUE = "queue"
    KINDS = ((SCHEDULE, "schedule"), (QUEUE, "queue"))

    kind = models.CharField(max_length=16, choices=KINDS)
    name = models.CharField(max_length=200)
    paused = models.BooleanField(default=True)
    reason = models.TextField(blank=True, default="")
    changed_by = models.CharField(max_length=150, help_text="who paused or resumed it last")
    changed_at = models.DateTimeField()
    paused_at = models.DateTimeField(null=True, blank=True,
                                     help_text="when the last pause began (kept by a resume: ticks between are paused)")
    shed = models.BooleanField(default=False,
                               help_text="the last change was the shedding controller's, not an operator's")

    class Meta:
        app_label = "composition"
        constraints = [models.UniqueConstraint(fields=["kind", "name"], name="composition_pause_once")]
        permissions = [("change_pauses", "Can pause and resume schedules and queues")]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} ({'paused' if self.paused else 'running'})"
