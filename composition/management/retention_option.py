"""``--older-than DAYS`` as the prune subcommands read it: the option, else the retention setting."""

from __future__ import annotations

from django.core.management.base import CommandError

from composition.conf import conf

__all__ = ["SECONDS_PER_DAY", "older_than_days"]

SECONDS_PER_DAY = 86_400.0
# A thousand years: anything longer is a typo, and beyond about 2.9 million days the cutoff date
# is not a date at all.
MAX_DAYS = 365_000.0


def older_than_days(option: float | None, setting: str) -> float:
    """Days from ``--older-than``, or from the ``setting`` (seconds) when it was not given.

    Raises CommandError when neither gives a number of days from 0 to ``MAX_DAYS`` (a setting of
    None keeps rows forever, so pruning by hand then needs the option).
    """
    if option is None:
        configured = getattr(conf, setting)
        if configured is None:
            raise CommandError(f"{setting} is None (keep forever): give --older-than DAYS")
        option = float(configured) / SECONDS_PER_DAY
    if not 0 <= option <= MAX_DAYS:  # nan and inf too: a date that far back overflows
        raise CommandError(f"--older-than must be between 0 and {MAX_DAYS:g} days, got {option:g}")
    return option
