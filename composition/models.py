"""The app's models live beside the code that uses them; Django finds them here."""

# Each subsystem adds one import line below for its models.
from composition.cache.models import PendingInvalidation
from composition.jobs.models import DeadLetter, ProcessedMessage, TaskRecord
from composition.locks.models import LockFence
from composition.operations.models import Operations
from composition.outbox.models import OutboxMessage
from composition.pauses.models import Pause
from composition.queues.models import QueueBucket
from composition.schedules.models import ScheduleState, ScheduleTick

# Named, so `from composition.models import DeadLetter` is an explicit export to type checkers.
__all__ = ["DeadLetter", "LockFence", "Operations", "OutboxMessage", "Pause", "PendingInvalidation", "ProcessedMessage",
           "QueueBucket", "ScheduleState", "ScheduleTick", "TaskRecord"]
