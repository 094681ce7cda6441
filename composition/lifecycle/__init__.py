"""Explicit lifecycle: components start in dependency order and stop in reverse.

The ground of the package imports nothing of ours above ``conf``, ``metrics`` and ``errors``:

- ``base``: the ``Component`` protocol;
- ``ordering``: the start order (a stable topological sort by ``depends_on``);
- ``stopping``: bounded stops and drain hooks, and their ``StopResult``;
- ``system``: ``System``, its start with rollback, drain, reverse stop and signal policy;
- ``processes``: child processes as components (own session, die with the parent);
- ``periodic``: ``PeriodicComponent``, a round repeated on a background thread.

The worker side sits on top of jobs, outbox, cache and health and is imported by its path:

- ``components``: logging, metrics, database, cache and broker components;
- ``worker_threads``: Dramatiq worker threads (``WorkerComponent``);
- ``heartbeat``: the worker heartbeat for ``health workers`` (``HeartbeatComponent``);
- ``workers``: the system ``runworkers`` runs, one process or a supervisor of several.
"""

from composition.lifecycle.base import Component
from composition.lifecycle.periodic import PeriodicComponent
from composition.lifecycle.processes import ProcessComponent
from composition.lifecycle.stopping import StopResult
from composition.lifecycle.system import System

__all__ = ["Component", "PeriodicComponent", "ProcessComponent", "StopResult", "System"]
