"""The app's models live beside the code that uses them; Django finds them here."""

# Each subsystem adds one import line below for its models.
from composition.cache.models import PendingInvalidation  # noqa: F401
from composition.jobs.models import DeadLetter, ProcessedMessage, TaskRecord  # noqa: F401
from composition.locks.models import LockFence  # noqa: F401
from composition.operations.models import Operations  # noqa: F401
from composition.outbox.models import OutboxMessage  # noqa: F401
from composition.pauses.models import Pause  # noqa: F401
from composition.queues.models import QueueBucket  # noqa: F401
from composition.schedules.models import ScheduleState, ScheduleTick  # noqa: F401
