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
    - ``check() -> None``: raise when unhealthy (used by ``manage.py system``);
    - ``cancel_start() -> None``: make a ``start()`` that is waiting (for a child to be ready)
      give up and raise; ``kill_now() -> None``: end at once (a second Ctrl-C). Both are called
      from the System's signal handler, on the main thread wherever it is: they set a flag or
      send a signal, and take no lock (one the interrupted code holds would never be released).
    """

    name: str

    def start(self) -> None: ...

    def stop(self, timeout_s: float) -> None: ...
