"""The admin: every ``ModelAdmin`` of the app (``dead_letters``, ``ledger``, ``outbox``, ``pauses``,
``task_results``) and the operations page (``operations``, with the schedules and their pause
buttons); importing this package registers them, as Django's autodiscovery does. ``ReadOnlyRows`` is the mixin for
rows only the library writes; ``format`` the columns' formatting. Invariant: no screen changes a
row except through the library's calls.
"""

from composition.admin import dead_letters, ledger, operations, outbox, pauses, task_results  # noqa: F401  (registers them)
from composition.admin.dead_letters import ReadOnlyRows

__all__ = ["ReadOnlyRows"]
