"""``django.tasks`` through the transactional outbox: ``OutboxBackend``.

``TASKS = {"default": {"BACKEND": "composition.tasks.OutboxBackend"}}`` makes ``@task`` code
enqueue in the caller's transaction and run under ``runworkers`` with the jobs' retries, time
limit and dead letters. It uses Django's ``django.tasks`` (Django 6) or the ``django-tasks``
backport (the ``tasks`` extra: ``pip install './django-backend-composition[tasks]'`` from a
clone; add ``"django_tasks"`` to ``INSTALLED_APPS`` there).

The package, module by module:

- ``backend``: ``OutboxBackend`` (enqueue, ``get_result``); ``options``: what ``QUEUES`` and
  ``OPTIONS`` mean, a run policy per queue; ``errors``: ``InvalidBackendOptions`` and
  ``InvalidTaskArguments``;
- ``payload``: a task in an outbox payload and back, and its argument check;
- ``actors``: the ``@job`` actor per backend and queue that runs tasks in the workers;
- ``results``: the task's state, read from the outbox, the ledger, the dead letters and the
  worker heartbeats;
- ``setup``: what ``composition``'s ``ready()`` does (declare the actors, register the checks);
- ``_compat``: ``django.tasks`` or ``django_tasks``, under one set of names.
"""

from composition.tasks.backend import OutboxBackend
from composition.tasks.errors import InvalidBackendOptions, InvalidTaskArguments
from composition.tasks.options import ACTOR_PREFIX, actor_name

__all__ = ["ACTOR_PREFIX", "InvalidBackendOptions", "InvalidTaskArguments", "OutboxBackend", "actor_name"]
