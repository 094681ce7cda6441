"""``DefinedHooks``: the configured broker calls a middleware hook only where a middleware has
one, as Dramatiq would have called them all: before-hooks in list order, after-hooks reversed, a
``MiddlewareError`` (``SkipMessage``) out of a before-hook raised, any other error logged and the
rest still called; a middleware added later, or a hook set on an instance, is called too."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from dramatiq.middleware import Middleware, SkipMessage

from composition.broker.configured import build_broker
from composition.testing import free_port


class Recorder(Middleware):
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def before_ack(self, broker: Any, message: Any) -> None:
        self.calls.append(f"before {self.name}")

    def after_ack(self, broker: Any, message: Any) -> None:
        self.calls.append(f"after {self.name}")


class Silent(Middleware):
    """Defines no hook: the base class's empty ones."""


class Skips(Middleware):
    def before_process_message(self, broker: Any, message: Any) -> None:
        raise SkipMessage()


class Fails(Middleware):
    def before_ack(self, broker: Any, message: Any) -> None:
        raise RuntimeError("hook failed")


def _broker(url: str, middleware: list[Middleware]) -> Any:
    return build_broker(url, heartbeat_timeout_s=4, maintenance_chance=0, middleware=middleware)


@pytest.mark.parametrize("url", [f"redis://127.0.0.1:{free_port()}/0", f"amqp://guest:guest@127.0.0.1:{free_port()}/"])
def test_hooks_run_in_dramatiq_s_order_with_its_error_handling(url: str, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []
    broker = _broker(url, [Recorder("a", calls), Silent(), Fails(), Recorder("b", calls)])  # never connects
    with caplog.at_level(logging.CRITICAL):
        broker.emit_before("ack", object())
    broker.emit_after("ack", object())
    assert calls == ["before a", "before b", "after b", "after a"]
    assert "Unexpected failure in before_ack" in caplog.text and "hook failed" in caplog.text

    broker.add_middleware(Recorder("c", calls))
    late = Silent()
    late.before_ack = lambda broker, message: calls.append("before instance")  # type: ignore[method-assign]
    broker.add_middleware(late)
    calls.clear()
    broker.emit_before("ack", object())
    assert calls == ["before a", "before b", "before c", "before instance"]

    broker.add_middleware(Skips())
    with pytest.raises(SkipMessage):
        broker.emit_before("process_message", object())
