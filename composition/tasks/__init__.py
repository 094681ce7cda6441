"""``django.tasks`` through the transactional outbox: ``OutboxBackend``.

``TASKS = {"default": {"BACKEND": "composition.tasks.OutboxBackend"}}`` makes ``@task`` code enqueue
in the caller's transaction and run under ``runworkers`` with the jobs' retries, time limit and dead
letters, on ``django.tasks`` (Django 6) or the ``django-tasks`` backport (the ``tasks`` extra).
Modules: ``backend``, ``options`` (``QUEUES``, ``OPTIONS``), ``errors``, ``payload`` (a task in an
outbox payload), ``actors`` (the workers' side), ``listeners`` (the result its context and signal
receivers see), ``calls`` (a task called, its return value kept), ``records`` (a result as its runs
write it), ``leases`` (running results kept RUNNING), ``results`` (``get_result``), ``setup``
(what ``ready()`` does) and ``_compat`` (``django.tasks`` or ``django_tasks``).
"""

from composition.tasks.backend import OutboxBackend
from composition.tasks.errors import InvalidBackendOptions, InvalidTaskArguments
from composition.tasks.options import ACTOR_PREFIX, actor_name

__all__ = ["ACTOR_PREFIX", "InvalidBackendOptions", "InvalidTaskArguments", "OutboxBackend", "actor_name"]
