"""``--older-than DAYS`` as the prune subcommands read it: the option, else the retention setting."""

from __future__ import annotations

from django.core.management.base import CommandError

from composition.conf import conf

__all__ = ["SECONDS_PER_DAY", "older_than_days"]

SECONDS_PER_DAY = 86_400.0


def older_than_days(option: float | None, setting: str) -> float:
    """Days from ``--older-than``, or from the ``setting`` (seconds) when it was not given.

    Raises CommandError when neither gives a number of days >= 0 (a setting of None keeps rows
    forever, so pruning by hand then needs the option).
    """
    if option is None:
        configured = getattr(conf, setting)
        if configured is None:
            raise CommandError(f"{setting} is None (keep forever): give --older-than DAYS")
        option = float(configured) / SECONDS_PER_DAY
    if option < 0:
        raise CommandError("--older-than must be >= 0 days")
    return option
