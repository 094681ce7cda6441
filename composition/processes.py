"""``composition.processes``: child-process components under their first import path.

They live in ``composition.lifecycle.processes``.
"""

from composition.lifecycle.processes import ProcessComponent, detach_and_die_with_parent

__all__ = ["ProcessComponent", "detach_and_die_with_parent"]
