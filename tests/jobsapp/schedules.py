"""The test app's schedules: declared only in the runworkers of the schedule scenarios, which set
``JOBSAPP_SCHEDULES`` (every other test's workers must not fire anything on their own)."""

from __future__ import annotations

import os
from datetime import timedelta

from composition.schedules import schedule
from tests.jobsapp import jobs

if os.environ.get("JOBSAPP_SCHEDULES") == "every-second":
    schedule(jobs.scheduled_effect, every=timedelta(seconds=1), name="every-second",
             payload={"label": "every-second"})
elif os.environ.get("JOBSAPP_SCHEDULES") == "overlap":
    schedule(jobs.scheduled_slow, every=timedelta(seconds=1), name="overlap", overlap="skip",
             payload={"label": "overlap", "seconds": 1.5})
elif os.environ.get("JOBSAPP_SCHEDULES") == "skipping":
    schedule(jobs.scheduled_skip, every=timedelta(seconds=1), name="skipping", overlap="skip",
             payload={"label": "skipping"})
