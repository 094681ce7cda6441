"""Explicit lifecycle: components start in dependency order and stop in reverse.

The ground imports nothing of ours above ``conf``, ``metrics`` and ``errors``: ``base`` (the
``Component`` protocol), ``ordering`` (start order by ``depends_on``), ``stopping`` (bounded
stops, ``StopResult``), ``system`` (``System``), ``ready_file`` (its ``ReadyFile``), ``signals``
(what a stop signal does to it), ``processes`` (child processes), ``periodic``
(``PeriodicComponent``). The worker side sits on jobs, outbox, cache and health and is imported
by its path: ``components``, ``worker_threads`` (``WorkerComponent``), ``heartbeat``
(``HeartbeatComponent``) and ``workers`` (the system ``runworkers`` runs).
"""

from composition.lifecycle.base import Component
from composition.lifecycle.periodic import PeriodicComponent
from composition.lifecycle.processes import ProcessComponent
from composition.lifecycle.stopping import StopResult
from composition.lifecycle.system import System

__all__ = ["Component", "PeriodicComponent", "ProcessComponent", "StopResult", "System"]
