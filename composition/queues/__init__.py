"""Queues as an operator runs them: pause and resume one for every host, durably
(``control``: ``pause_queue``, ``resume_queue``); each worker process's copy of the paused
queues (``refresher``: ``QueuePauseRefresher``); each queue's depth, age, throughput and pause
(``status``: ``queue_rows``). Invariant: a paused queue starts no job on any host once every
worker has read it, and loses none: its messages stay on the broker and publishing goes on.
"""

from composition.queues.control import QueueNotPausable, known_queues, pause_queue, paused_queue_names, resume_queue
from composition.queues.refresher import QueuePauseRefresher
from composition.queues.status import QueueRow, queue_rows

__all__ = ["QueueNotPausable", "QueuePauseRefresher", "QueueRow", "known_queues", "pause_queue",
           "paused_queue_names", "queue_rows", "resume_queue"]
