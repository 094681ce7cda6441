"""Billing's schedules: every morning in Berlin, a reminder of each invoice still open after
``BILLING["REMINDER_AFTER_DAYS"]`` days. A missed morning (no scheduler running) is caught up
once; a sweep still running when the next is due makes the next one wait."""

from __future__ import annotations

from billing import jobs
from billing.wiring import setting
from composition.schedules import schedule

schedule(jobs.send_overdue_reminders, cron="0 9 * * *", tz="Europe/Berlin", catch_up="latest", overlap="skip",
         payload={"overdue_days": int(setting("REMINDER_AFTER_DAYS"))})
