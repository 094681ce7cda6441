"""Upstream tests of ``django.tasks`` backends, adapted to ``composition.tasks.OutboxBackend``: the
``DatabaseBackend`` test cases of django-tasks-db 0.12.0 and the task API tests of django-tasks
0.12.0 (BSD, see LICENSE; README.md lists every test changed or left out, with its reason).

They run on a ``TASKS`` alias of their own (``ALIAS``) whose queues no other test's worker serves;
one attempt per task, as ``DatabaseBackend`` runs a task once.
"""

ALIAS = "upstream"
# Upstream's "default" and "queue-1": the queues of ALIAS.
QUEUE = "upstream_tasks"
QUEUE_1 = "upstream_queue_1"

# TASKS[ALIAS] (tests/settings.py, where it belongs, or else tests/tasks/upstream/conftest.py).
BACKEND_SETTINGS = {
    "BACKEND": "composition.tasks.OutboxBackend",
    "QUEUES": [QUEUE, QUEUE_1],
    "OPTIONS": {"MAX_ATTEMPTS": 1, "TIMEOUT_S": 30},
}
