"""Pauses: what an operator stopped (a schedule, a queue), durable and the same for every host.

A ``Pause`` row per paused or once-paused thing says whether it is paused, by whom, since when
and why; ``pause()`` and ``resume()`` change it and log the change, ``paused_names(kind)`` reads
what is paused now, ``kept_reason`` says what a second pause did not record. Modules: ``models``,
``control``.
"""

from composition.pauses.control import MAX_REASON_CHARS, PAUSE_PERMISSION, kept_reason, pause, paused_names, resume
from composition.pauses.models import Pause

__all__ = ["MAX_REASON_CHARS", "PAUSE_PERMISSION", "Pause", "kept_reason", "pause", "paused_names", "resume"]
