"""A schedule's state (the watermark every scheduler advances) and its fired ticks."""

from __future__ import annotations

from django.db import models


class ScheduleState(models.Model):
    """Per schedule: the last tick evaluated (fired, caught up, missed, skipped or paused) and
    how many ticks went each way. Every scheduler advances it under ``FOR UPDATE``."""

    name = models.CharField(primary_key=True, max_length=200)
    watermark = models.DateTimeField(help_text="the last tick evaluated")
    timing = models.CharField(max_length=300, blank=True, default="",
                              help_text="the timing the watermark was taken on (Schedule.timing)")
    previous_timing = models.CharField(max_length=300, blank=True, default="",
                                       help_text="the timing a deploy replaced (its hosts leave the schedule alone)")
    timing_changed_at = models.DateTimeField(null=True, blank=True, help_text="when the timing last changed")
    last_fired_at = models.DateTimeField(null=True, blank=True, help_text="the last tick that fired")
    fired = models.BigIntegerField(default=0)
    caught_up = models.BigIntegerField(default=0)
    missed = models.BigIntegerField(default=0)
    skipped = models.BigIntegerField(default=0)
    paused = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        app_label = "composition"

    def __str__(self) -> str:
        return self.name


class ScheduleTick(models.Model):
    """A tick that fired (or a manual run) and, for the overlap rule, whether its run is over.
    A tick fires once: the unique constraint holds whatever the schedulers do."""

    schedule = models.CharField(max_length=200)
    fire_at = models.DateTimeField()
    manual = models.BooleanField(default=False)
    catch_up = models.BooleanField(default=False)
    created_at = models.DateTimeField(help_text="the database's time when the tick fired")
    finished_at = models.DateTimeField(null=True, blank=True, help_text="when its run ended, for overlap='skip'")
    lease_until = models.DateTimeField(null=True, blank=True,
                                       help_text="until when an unfinished run still counts as running")

    class Meta:
        app_label = "composition"
        constraints = [models.UniqueConstraint(fields=["schedule", "fire_at"], condition=models.Q(manual=False),
                                               name="composition_schedule_tick_once")]
        indexes = [models.Index(fields=["schedule", "-fire_at"], name="composition_tick_recent"),
                   models.Index(fields=["created_at"], name="composition_tick_created")]

    def __str__(self) -> str:
        return f"{self.schedule} @ {self.fire_at.isoformat()}"
