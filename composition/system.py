"""``composition.system``: the lifecycle primitives under their first import path.

They live in ``composition.lifecycle``; this module keeps ``composition.system.Component`` and
``composition.system.System`` (a public contract) and the other names it always had, with the
errors a start or a bad graph raises.
"""

from composition.errors import ComponentError, SystemStartError
from composition.lifecycle.base import Component
from composition.lifecycle.ordering import order_components
from composition.lifecycle.stopping import StopResult, call_with_timeout, stop_with_timeout
from composition.lifecycle.system import FORCED_EXIT_CODE, MIN_STOP_BUDGET_S, System

__all__ = [
    "FORCED_EXIT_CODE",
    "MIN_STOP_BUDGET_S",
    "Component",
    "ComponentError",
    "StopResult",
    "System",
    "SystemStartError",
    "call_with_timeout",
    "order_components",
    "stop_with_timeout",
]
