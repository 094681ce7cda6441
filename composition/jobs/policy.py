"""The retry policy of a job and the backoff it uses between attempts.

``max_attempts`` counts runs, not retries: Dramatiq's ``max_retries`` is ``max_attempts - 1``.
Delays grow exponentially from ``initial_delay_s`` and are jittered upwards by up to
``JITTER_FRACTION`` of the step, then capped at ``max_delay_s``. The jitter band of one step
never reaches the next step's floor, so for one message the delays never shrink: strictly
growing below the cap, equal to the cap once it is reached, always within [initial, max].
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from composition.seconds import checked_seconds

__all__ = ["JITTER_FRACTION", "MAX_SECONDS", "JobPolicy", "backoff_s", "redelivery_window_s"]

# Up to half a step of random extra delay spreads a burst of failures (thundering herd) while
# keeping step n's band [b, 1.5 b] below step n+1's floor 2 b.
JITTER_FRACTION = 0.5
# 2**32 steps overflow nothing and every realistic cap is reached long before.
_MAX_EXPONENT = 32
# A delay or a time limit past a year is a typo (inf and 1e20 overflowed the millisecond fields).
MAX_SECONDS = 365 * 86_400.0


def backoff_s(retries: int, *, initial_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``retries + 1`` (``retries`` = retries so far, from 0).

    Always within ``[initial_s, max_s]``; raises ValueError when ``initial_s`` is not positive or
    exceeds ``max_s``.
    """
    if initial_s <= 0 or initial_s > max_s:
        raise ValueError(f"need 0 < initial_s <= max_s, got initial_s={initial_s}, max_s={max_s}")
    step = initial_s * 2 ** min(max(retries, 0), _MAX_EXPONENT)
    jitter = (rng or random).uniform(0.0, JITTER_FRACTION) * step
    return min(max_s, step + jitter)


@dataclass(frozen=True)
class JobPolicy:
    """What ``@job`` was declared with; stored on the actor as the ``job_policy`` option."""

    queue: str = "default"
    max_attempts: int = 5
    initial_delay_s: float = 10.0
    max_delay_s: float = 900.0
    timeout_s: float = 120.0
    permanent: tuple[type[BaseException], ...] = ()
    idempotent: bool = False
    priority: int = 0

    def __post_init__(self) -> None:
        # Checked here, at declaration: a bad value accepted would fail later, in a worker or in
        # every system check of the project, far from the line that wrote it.
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"max_attempts must be a whole number of at least 1, got {self.max_attempts!r}")
        for name in ("initial_delay_s", "max_delay_s", "timeout_s"):
            checked_seconds(name, getattr(self, name), at_most=MAX_SECONDS)
        if self.initial_delay_s > self.max_delay_s:
            raise ValueError("need 0 < initial_delay_s <= max_delay_s, got "
                             f"{self.initial_delay_s} and {self.max_delay_s}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ValueError(f"priority must be a whole number, got {self.priority!r}")
        if not isinstance(self.idempotent, bool):  # "no" and 0.0 read from a setting ran it under the ledger
            raise ValueError(f"idempotent must be True or False, got {self.idempotent!r}")
        if not isinstance(self.queue, str) or not self.queue.strip() or self.queue.endswith((".DQ", ".XQ")):
            raise ValueError(f"queue must be a queue's name (not empty, not a delay or dead-letter queue's), "
                             f"got {self.queue!r}")
        for error in self.permanent:
            if not (isinstance(error, type) and issubclass(error, BaseException)):
                raise TypeError(f"permanent must hold exception classes, got {error!r}")

    @property
    def max_retries(self) -> int:
        return self.max_attempts - 1

    def delay_s(self, retries: int, rng: random.Random | None = None) -> float:
        """The backoff before the next attempt, after ``retries`` retries so far."""
        return backoff_s(retries, initial_s=self.initial_delay_s, max_s=self.max_delay_s, rng=rng)


class _UpperJitter(random.Random):
    """A source of randomness that always draws the top of the range: with it ``backoff_s``
    returns the longest delay it can ever choose, without restating its formula here."""

    def uniform(self, a: float, b: float) -> float:
        return b


_LONGEST = _UpperJitter()


def redelivery_window_s(policy: JobPolicy, *, heartbeat_timeout_s: float, lease_s: float) -> float:
    """Seconds during which a message of a job with ``policy`` may still be delivered again after
    its effects committed, at worst: every backoff delay at its jittered maximum, every attempt
    running to its ``timeout_s``, plus the time a dead worker's message takes to return
    (``heartbeat_timeout_s``) and a crashed relay's row to be sent again (``lease_s``)."""
    delays_s = sum(backoff_s(retries, initial_s=policy.initial_delay_s, max_s=policy.max_delay_s, rng=_LONGEST)
                   for retries in range(policy.max_retries))
    return delays_s + policy.max_attempts * policy.timeout_s + heartbeat_timeout_s + lease_s
