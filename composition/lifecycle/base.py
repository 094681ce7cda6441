"""The contract: what a ``System`` needs from a component."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Component"]


@runtime_checkable
class Component(Protocol):
    """What a System needs from a component.

    Optional extras, looked up with ``getattr``:

    - ``depends_on: tuple[str, ...]``: names of components that must start first;
    - ``begin_drain() -> None``: stop taking new work without waiting; called on every component
      first, so that all intake stops at once;
    - ``drain(deadline: float) -> None``: wait for in-flight work until ``deadline`` (a
      ``time.monotonic()`` value); called after every ``begin_drain`` and before any stop;
    - ``alive() -> bool``: False once the component died on its own (the running System stops);
    - ``stop_timeout_s: float``: this component's own stop budget;
    - ``check() -> None``: raise when unhealthy (used by ``manage.py system``).
    """

    name: str

    def start(self) -> None: ...

    def stop(self, timeout_s: float) -> None: ...
