"""``manage.py jobs check-compat`` over 100,000 messages in flight (issue 36): pending outbox rows,
open dead letters and the Redis broker's ready and delayed messages (tests/jobsapp/compat_work.py),
checked by a child process on each of ten code changes in turn (``COMPAT_CODE``,
tests/jobsapp/deploys.py): five breaking, five safe. Prints each change's wall time (Django's
start included) and the command's own time, checks the report against the expected counts, and
prints both against a baseline measured in the same run: ``manage.py check`` (the same process
start, no messages read). Goal: every report exact, each run under 5 s.

Run: ``python bench/bench_check_compat.py`` (env BENCH_MESSAGES, default 100000, split evenly
between the three sources). Exit status 1 when a goal is missed. It writes to the configured
database and broker, and deletes what it wrote (then VACUUMs the two tables) before it exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("LOG_LEVEL", "WARNING")

from _util import setup_django  # noqa: E402

setup_django("tests.settings")

from django.db import connection  # noqa: E402

from composition.jobs.models import DeadLetter  # noqa: E402
from composition.outbox.models import OutboxMessage  # noqa: E402
from composition.testing import subprocess_env  # noqa: E402
from tests.jobsapp.compat_work import clear_compat_work, expected_problems, matched, queue_compat_work  # noqa: E402
from tests.jobsapp.deploys import BREAKING, COMPAT_CODES  # noqa: E402

MESSAGES = int(os.environ.get("BENCH_MESSAGES", "100000"))
GOAL_S = 5.0


def _run(*argv: str, **env: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), *argv], cwd=ROOT, capture_output=True, text=True,
                          env=subprocess_env(DJANGO_SETTINGS_MODULE="tests.settings", **env), timeout=300)
    return time.monotonic() - started, done


def main() -> int:
    per_source = -(-MESSAGES // 3)  # at least MESSAGES in all
    clear_compat_work()
    started = time.monotonic()
    written = queue_compat_work(per_source)
    print(f"wrote {3 * per_source} messages ({per_source} pending outbox rows, {per_source} open dead letters, "
          f"{per_source} on the Redis broker, half of them delayed) in {time.monotonic() - started:.1f} s")
    ok = True
    try:
        baseline_s, done = _run("check")
        print(f"baseline: manage.py check {baseline_s:.2f} s wall")
        print(f"{'code change':<20} {'kind':<9} {'wall s':>7} {'command s':>10} {'x check':>8} {'problems':>9} report")
        for code in COMPAT_CODES[1:]:
            wall_s, done = _run("jobs", "check-compat", "--json", COMPAT_CODE=code)
            report = json.loads(done.stdout)
            expected = expected_problems(code, written)
            exact = (matched(report["problems"], expected) == expected
                     and done.returncode == (1 if code in BREAKING else 0)
                     and report["broker_messages_read"] == per_source)
            ok &= exact and wall_s < GOAL_S
            print(f"{code:<20} {'breaking' if code in BREAKING else 'safe':<9} {wall_s:>7.2f} "
                  f"{report['seconds']:>10.2f} {wall_s / baseline_s:>8.2f} "
                  f"{sum(p['count'] for p in report['problems']):>9} {'exact' if exact else 'WRONG'}")
    finally:
        clear_compat_work()
        with connection.cursor() as cursor:
            for model in (OutboxMessage, DeadLetter):
                cursor.execute(f"VACUUM ANALYZE {model._meta.db_table}")
    print("goal: every report exact and each run under 5 s:", "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
