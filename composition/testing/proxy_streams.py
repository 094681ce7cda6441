"""The connections through the fault proxy (``composition.testing.proxy``): a byte stream each
way, holding what one end sent until it is due, then forwarding it in order, and what each socket
waits for in the proxy's selector. A stream stops reading past ``MAX_PENDING_BYTES`` held, so
TCP's own flow control reaches the sender."""

from __future__ import annotations

import selectors
import socket
import struct
import time
from collections import deque
from contextlib import suppress
from dataclasses import dataclass, field

__all__ = [
    "CHUNK_BYTES", "CONNECT_TIMEOUT_S", "MAX_PENDING_BYTES", "End", "ProxiedConnection", "Stream", "close_with_reset",
]

CHUNK_BYTES = 64 * 1024
MAX_PENDING_BYTES = 1024 * 1024
# Loopback answers a connect at once (accepted or refused); longer means a full listen backlog.
CONNECT_TIMEOUT_S = 2.0


def close_with_reset(sock: socket.socket) -> None:
    """Close with an RST rather than a FIN (SO_LINGER on, zero seconds)."""
    with suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@dataclass(eq=False)
class Stream:
    """The bytes one end sent, on their way to the other end."""

    source: socket.socket
    sink: socket.socket
    pending: deque[tuple[float, memoryview]] = field(default_factory=deque)  # (due, bytes), in order
    pending_bytes: int = 0
    ended: bool = False  # the source sent its FIN (or failed while blackholed)
    shut: bool = False  # that FIN was passed on: the sink's write half is shut
    sink_full: bool = False  # the sink's send buffer is full: wait until it is writable

    def drop_pending(self) -> None:
        self.pending.clear()
        self.pending_bytes = 0
        self.sink_full = False

    def read(self, delay_s: float | None) -> None:
        """Take what the source sent: held ``delay_s`` seconds, or dropped when None (a cut
        network). Raises the socket's OSError."""
        try:
            data = self.source.recv(CHUNK_BYTES)
        except BlockingIOError:
            return
        if not data:
            self.ended = True
        elif delay_s is not None:
            self.pending.append((time.monotonic() + delay_s, memoryview(data)))
            self.pending_bytes += len(data)

    def send_due(self, now: float) -> None:
        """Forward what is due by ``now`` while the sink takes it, then a FIN once the source
        ended and nothing is left. Raises the socket's OSError."""
        while self.pending and not self.sink_full and self.pending[0][0] <= now:
            due, data = self.pending[0]
            try:
                sent = self.sink.send(data)
            except BlockingIOError:
                sent = 0
            self.pending_bytes -= sent
            if sent < len(data):
                self.pending[0] = (due, data[sent:])
                self.sink_full = True
                return
            self.pending.popleft()
        if self.ended and not self.pending and not self.shut:
            self.sink.shutdown(socket.SHUT_WR)
            self.shut = True

    @property
    def next_due(self) -> float | None:
        """When the next held chunk may go, if the sink can take it."""
        return self.pending[0][0] if self.pending and not self.sink_full else None


@dataclass(eq=False)
class ProxiedConnection:
    """A client's connection and the proxy's own to the service, with a stream each way."""

    client: socket.socket
    upstream: socket.socket
    up: Stream = field(init=False)
    down: Stream = field(init=False)
    registered: dict[socket.socket, int] = field(default_factory=dict)  # the selector's events

    def __post_init__(self) -> None:
        self.up = Stream(self.client, self.upstream)
        self.down = Stream(self.upstream, self.client)

    @classmethod
    def open(cls, client: socket.socket, target: tuple[str, int]) -> ProxiedConnection | None:
        """``client``'s connection on to ``target``; None, and ``client`` reset, when the service
        does not answer (the client sees what a direct connect would)."""
        try:
            upstream = socket.create_connection(target, timeout=CONNECT_TIMEOUT_S)
        except OSError:
            close_with_reset(client)
            return None
        for sock in (client, upstream):
            sock.setblocking(False)
            # Chunks go on as they came: Nagle would add its own delays to small ones.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(client, upstream)

    def streams(self) -> tuple[Stream, Stream]:
        return self.up, self.down

    def ends(self) -> tuple[End, End]:
        return End(self, self.up, self.down), End(self, self.down, self.up)

    def register(self, selector: selectors.BaseSelector, *, blackholed: bool) -> None:
        """Wait in ``selector`` for what each end can do next (``End.events``)."""
        for end in self.ends():
            sock, events = end.sends.source, end.events(blackholed=blackholed)
            current = self.registered.get(sock, 0)
            if events == current:
                continue
            if not events:
                selector.unregister(sock)
                del self.registered[sock]
            elif not current:
                selector.register(sock, events, end)
            else:
                selector.modify(sock, events, end)
            if events:
                self.registered[sock] = events

    def unregister(self, selector: selectors.BaseSelector) -> None:
        for sock in list(self.registered):
            selector.unregister(sock)
        self.registered.clear()

    def close(self, *, reset: bool) -> None:
        for sock in (self.client, self.upstream):
            if reset:
                close_with_reset(sock)
            else:
                sock.close()

    @property
    def finished(self) -> bool:
        return all(stream.ended and stream.shut for stream in self.streams())


@dataclass(eq=False)
class End:
    """What the selector knows of one socket: its connection, what it sends and what it gets."""

    connection: ProxiedConnection
    sends: Stream
    receives: Stream

    def events(self, *, blackholed: bool) -> int:
        """What to wait for on this socket: reading while its bytes have room (always when
        blackholed: they are dropped), writing while its sink is full."""
        events = 0
        if not self.sends.ended and (blackholed or self.sends.pending_bytes < MAX_PENDING_BYTES):
            events |= selectors.EVENT_READ
        if self.receives.sink_full:
            events |= selectors.EVENT_WRITE
        return events
