"""Start order: a stable topological sort of components by ``depends_on``."""

from __future__ import annotations

from collections.abc import Iterable

from composition.errors import ComponentError
from composition.lifecycle.base import Component

__all__ = ["order_components"]


def order_components(components: Iterable[Component]) -> list[Component]:
    """Stable topological order by ``depends_on`` (ties keep the given order); raises
    ComponentError on a duplicate name, an unknown dependency or a cycle."""
    given = list(components)
    by_name: dict[str, Component] = {}
    for component in given:
        if component.name in by_name:
            raise ComponentError(component.name, "two components share this name")
        by_name[component.name] = component
    for component in given:
        for dep in getattr(component, "depends_on", ()):
            if dep not in by_name:
                raise ComponentError(component.name, f"depends on unknown component {dep!r}")
    ordered: list[Component] = []
    placed: set[str] = set()
    while len(ordered) < len(given):
        progressed = False
        for component in given:
            if component.name in placed:
                continue
            if all(dep in placed for dep in getattr(component, "depends_on", ())):
                ordered.append(component)
                placed.add(component.name)
                progressed = True
                break
        if not progressed:
            stuck = sorted(c.name for c in given if c.name not in placed)
            raise ComponentError(stuck[0], f"dependency cycle among {stuck}")
    return ordered
