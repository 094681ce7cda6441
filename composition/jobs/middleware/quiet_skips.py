"""``QuietPutBacks``: Dramatiq's worker warns "Message ... was skipped." for every skipped
message; one that went back to wait (its queue paused, its job at a limit, its code not yet
deployed) is not a problem, and a warning per put-back buried the real ones; one dropped past its
expiry has ``Expiry``'s own warning. This filter drops exactly those records."""

from __future__ import annotations

import logging

from composition.broker.pausing import handed_back
from composition.jobs.middleware.expiry import expired
from composition.jobs.middleware.put_backs import put_back

__all__ = ["DRAMATIQ_WORKER_LOGGER", "QuietPutBacks", "quiet_put_backs"]

DRAMATIQ_WORKER_LOGGER = "dramatiq.worker.WorkerThread"
_SKIPPED = "Message %s was skipped."


class QuietPutBacks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != _SKIPPED or not record.args or not isinstance(record.args, tuple):
            return True
        message = record.args[0]
        return not (hasattr(message, "options") and (put_back(message) or handed_back(message) or expired(message)))


def quiet_put_backs() -> None:
    """Install the filter on Dramatiq's worker logger, once."""
    logger = logging.getLogger(DRAMATIQ_WORKER_LOGGER)
    if not any(isinstance(existing, QuietPutBacks) for existing in logger.filters):
        logger.addFilter(QuietPutBacks())
