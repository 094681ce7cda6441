"""``DefinedHooks``: a broker that calls a middleware's hook only where the middleware has one.

Dramatiq's ``emit_before``/``emit_after`` call every middleware for every event, most of them
the base class's empty methods: with the job middleware that is 64 calls per job (four events,
sixteen middleware) for the 25 that do something, and 32 per publish for none. Same order, same
error handling as Dramatiq's; the hooks are looked up again whenever the middleware list changes.
"""

from __future__ import annotations

from typing import Any

from dramatiq.broker import Broker
from dramatiq.middleware import Middleware, MiddlewareError

__all__ = ["DefinedHooks"]


class DefinedHooks(Broker):
    """Mixed in before a Dramatiq broker class (see module doc)."""

    # (the middleware list the hooks were looked up in, hook name -> its hooks): one attribute,
    # so that a thread never pairs one list with another list's hooks.
    _hooks: tuple[list[Middleware], dict[str, tuple[tuple[Any, Middleware], ...]]] | None = None

    def emit_before(self, signal: str, *args: Any, **kwargs: Any) -> None:
        signal = "before_" + signal
        for hook, middleware in self._defined(signal):
            try:
                hook(self, *args, **kwargs)
            except MiddlewareError:
                raise
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", signal, middleware, exc_info=True)

    def emit_after(self, signal: str, *args: Any, **kwargs: Any) -> None:
        signal = "after_" + signal
        for hook, middleware in reversed(self._defined(signal)):
            try:
                hook(self, *args, **kwargs)
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", signal, middleware, exc_info=True)

    def _defined(self, name: str) -> tuple[tuple[Any, Middleware], ...]:
        """(bound hook, middleware) of every middleware whose ``name`` is not the base class's
        empty one, in list order."""
        state = self._hooks
        if state is None or state[0] != self.middleware:  # compares the items by identity, in C
            state = self._hooks = (list(self.middleware), {})
        hooks = state[1].get(name)
        if hooks is None:
            empty = getattr(Middleware, name, None)
            hooks = state[1][name] = tuple(
                (hook, middleware) for middleware in state[0]
                if (hook := getattr(middleware, name, None)) is not None
                and getattr(hook, "__func__", None) is not empty)
        return hooks
