"""``described(exc)``: how logs, dead letters and health answers show an exception."""

from __future__ import annotations

import pytest

from composition.errors import described


def test_an_exception_whose_text_is_empty_is_described_by_its_arguments() -> None:
    # pika's connection errors print as nothing: `health readiness` said "AMQPConnectionError: ".
    pika = pytest.importorskip("pika")
    with pytest.raises(pika.exceptions.AMQPConnectionError) as caught:
        pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:1/%2F?connection_attempts=1"))
    assert str(caught.value) == ""
    assert described(caught.value).startswith("AMQPConnectionError: AMQPConnectorSocketConnectError: ")
    assert "Connection refused" in described(caught.value)
    assert described(ValueError()) == "ValueError: "  # nothing to say, nothing made up
    assert described(ValueError("bad input")) == "ValueError: bad input"
