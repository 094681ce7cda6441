"""Queues as an operator runs them: pause and resume one for every host, durably
(``control``: ``pause_queue``, ``resume_queue``); each worker process's copy of the paused
queues (``refresher``: ``QueuePauseRefresher``); non-essential queues shed under pressure
(``pressure``: the signals; ``shedding``: ``ShedController``); each queue's depth, age,
throughput and pause (``status``: ``queue_rows``); a paused queue's waiting messages made
replayable dead letters (``purge``: ``purge_queue``). Invariant: a paused queue starts no job on
any host once every worker has read it, and loses none: its messages stay on the broker and
publishing goes on (a shed one's publishes are refused by ``admit()`` instead), until a purge
records them as dead letters.
"""

from composition.queues.control import QueueNotPausable, known_queues, pause_queue, paused_queue_names, resume_queue
from composition.queues.pressure import Reading, read_pressure
from composition.queues.purge import PurgeResult, QueueNotPaused, purge_queue, waiting_to_purge
from composition.queues.refresher import QueuePauseRefresher
from composition.queues.shedding import SHEDDING_BY, ShedController, essential_queues
from composition.queues.status import QueueRow, queue_rows

__all__ = ["SHEDDING_BY", "PurgeResult", "QueueNotPausable", "QueueNotPaused", "QueuePauseRefresher",
           "QueueRow", "Reading", "ShedController", "essential_queues", "known_queues", "pause_queue",
           "paused_queue_names", "purge_queue", "queue_rows", "read_pressure", "resume_queue", "waiting_to_purge"]
