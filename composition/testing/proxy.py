"""A TCP proxy on loopback that a test switches between passing, delaying, blackholing and
resetting the connections between a client and a real service.

One daemon thread owns every socket; the mode setters hand their change to it and return once it
is applied to every open connection, so a test's next line already sees the new mode. Nothing the
proxy opened outlives ``close()``: a test's no-thread, no-listening-port checks depend on it.
"""

from __future__ import annotations

import ipaddress
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Literal
from urllib.parse import urlsplit

from composition.testing.proxy_streams import CHUNK_BYTES, End, ProxiedConnection, Stream, close_with_reset

__all__ = ["FaultProxy", "Mode", "fault_proxy"]

Mode = Literal["pass", "delay", "blackhole", "reset"]

_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
_APPLY_TIMEOUT_S = 5.0
_CLOSE_TIMEOUT_S = 5.0


class FaultProxy:
    """A TCP proxy on 127.0.0.1 (``host``, ``port``) in front of the service at ``target_host``:
    ``target_port``, which must be on loopback (127.0.0.0/8; ``ValueError`` otherwise).

    Its mode applies to open and new connections alike, from the moment the setter returns:

    - ``pass_through()`` (the default): bytes flow both ways.
    - ``delay(seconds)``: each chunk is forwarded ``seconds`` after it arrived, in both directions
      (a round trip gains twice the delay).
    - ``blackhole()``: connections are accepted and never answered; bytes from either end are
      read and dropped, with whatever was still waiting to be forwarded, and nothing is closed.
      This is a cut network whose kernel still ACKs: TCP keepalives and ``tcp_user_timeout``
      never fire, nor does the server's ``statement_timeout`` (it never got the query), so only a
      client's own read timeout ends a call. A FIN either end sent meanwhile is passed on once
      bytes flow again.
    - ``reset()``: every connection is closed with an RST at both ends, and each new one is
      accepted and reset at once (its client sees the connection reset, not refused).

    ``start()`` starts its thread; ``close()`` stops it and closes every socket (idempotent).
    ``connections`` counts the connections open through it; ``proxied_url(url)`` is ``url`` with
    its host and port replaced by the proxy's.
    """

    host = "127.0.0.1"

    def __init__(self, target_host: str, target_port: int) -> None:
        address = socket.gethostbyname(target_host)
        if ipaddress.ip_address(address) not in _LOOPBACK:
            raise ValueError(f"FaultProxy forwards to loopback only (127.0.0.0/8), not {target_host!r}")
        self.target = (address, target_port)
        # Bound to port 0 and kept open: the kernel's free port is ours from the start, with no
        # window for another process to take it (free_port() must close its probe socket).
        self._listener = socket.create_server((self.host, 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._connections: list[ProxiedConnection] = []
        self._changed = threading.Condition()
        self._mode: Mode = "pass"
        self._delay_s = 0.0
        self._requested = 0  # mode changes asked for; the thread has applied the first _applied
        self._applied = 0
        # The mode the thread acts on: set only by it, when it applies the one asked for, so a
        # change never takes effect halfway through one of its rounds.
        self._active: Mode = "pass"
        self._active_delay_s = 0.0
        self._closing = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"fault-proxy-{self.port}", daemon=True)

    def __repr__(self) -> str:
        return f"<FaultProxy {self.host}:{self.port} -> {self.target[0]}:{self.target[1]} {self._mode}>"

    # The test's side.

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def connections(self) -> int:
        """Connections open through the proxy now (a blackholed one counts until it is reset)."""
        return len(self._connections)

    def proxied_url(self, url: str) -> str:
        """``url`` (``postgresql://user@127.0.0.1:5432/db``) pointed at the proxy instead."""
        parts = urlsplit(url)
        credentials = parts.netloc.rpartition("@")[0]
        netloc = f"{credentials}@" if credentials else ""
        return parts._replace(netloc=f"{netloc}{self.host}:{self.port}").geturl()

    def pass_through(self) -> None:
        self._set("pass")

    def delay(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"delay must be >= 0 seconds, got {seconds}")
        self._set("delay", seconds)

    def blackhole(self) -> None:
        self._set("blackhole")

    def reset(self) -> None:
        self._set("reset")

    def close(self) -> None:
        """Stop the thread and close the listener and every connection (with a FIN)."""
        with self._changed:
            if self._closed:
                return
            self._closing = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join(_CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            raise RuntimeError(f"{self!r}: its thread did not stop within {_CLOSE_TIMEOUT_S}s")
        self._close_sockets()  # a proxy never started has them all still

    def _set(self, mode: Mode, delay_s: float = 0.0) -> None:
        with self._changed:
            if self._closing:
                raise RuntimeError(f"{self!r} is closed")
            self._mode, self._delay_s = mode, delay_s
            self._requested += 1
            wanted = self._requested
        if self._thread.ident is None:
            return  # not started: the thread applies it first thing
        self._wake()
        with self._changed:
            # A thread that stops, closed or failed, closes everything and sets _closed on its way out.
            self._changed.wait_for(lambda: self._applied >= wanted or self._closed, _APPLY_TIMEOUT_S)
            if self._applied < wanted:
                raise RuntimeError(f"{self!r}: its thread did not apply {mode!r} (closed: {self._closed})")

    def _wake(self) -> None:
        with suppress(OSError):
            self._wake_writer.send(b"\0")

    # The thread's side: only it touches the connections while it runs.

    def _run(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._wake_reader, selectors.EVENT_READ, "wake")
        try:
            while True:
                with self._changed:
                    if self._closing:
                        return
                    requested = self._requested
                    changed = self._applied < requested
                    if changed:
                        self._active, self._active_delay_s = self._mode, self._delay_s
                if changed:
                    self._apply_mode()
                    with self._changed:
                        self._applied = requested
                        self._changed.notify_all()
                for key, events in self._selector.select(self._next_due_in()):
                    if key.data == "listener":
                        self._accept()
                    elif key.data == "wake":
                        with suppress(BlockingIOError):
                            self._wake_reader.recv(CHUNK_BYTES)
                    else:
                        self._serve(key.data, events)
                self._forward_due()
        finally:
            self._close_sockets()

    def _apply_mode(self) -> None:
        if self._active == "reset":
            for connection in list(self._connections):
                self._drop(connection, abort=True)
        elif self._active == "blackhole":
            # Bytes still waiting were in flight on the cut network: they are lost with it.
            for connection in self._connections:
                for stream in connection.streams():
                    stream.drop_pending()
                self._register(connection)
        else:
            for connection in self._connections:
                self._register(connection)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError:
                continue  # the client gave up before we got to it
            if self._active == "reset":
                close_with_reset(client)
                continue
            connection = ProxiedConnection.open(client, self.target)
            if connection is None:
                continue
            self._connections.append(connection)
            self._register(connection)

    def _serve(self, end: End, events: int) -> None:
        connection = end.connection
        if connection not in self._connections:
            return  # dropped earlier in this round
        if events & selectors.EVENT_WRITE:
            end.receives.sink_full = False
        if events & selectors.EVENT_READ:
            self._read(connection, end.sends)
        if connection in self._connections:
            self._register(connection)

    def _read(self, connection: ProxiedConnection, stream: Stream) -> None:
        blackholed = self._active == "blackhole"
        try:
            stream.read(None if blackholed else self._active_delay_s if self._active == "delay" else 0.0)
        except OSError:
            if blackholed:
                stream.ended = True  # its RST never reaches the other end either
            else:
                self._drop(connection, abort=True)

    def _forward_due(self) -> None:
        if self._active not in ("pass", "delay"):
            return
        now = time.monotonic()
        for connection in list(self._connections):
            try:
                for stream in connection.streams():
                    stream.send_due(now)
            except OSError:
                self._drop(connection, abort=True)
                continue
            if connection.finished:
                self._drop(connection, abort=False)
            else:
                self._register(connection)

    def _next_due_in(self) -> float | None:
        if self._active not in ("pass", "delay"):
            return None
        dues = [due for connection in self._connections for stream in connection.streams()
                if (due := stream.next_due) is not None]
        return max(0.0, min(dues) - time.monotonic()) if dues else None

    def _register(self, connection: ProxiedConnection) -> None:
        connection.register(self._selector, blackholed=self._active == "blackhole")

    def _drop(self, connection: ProxiedConnection, *, abort: bool) -> None:
        """Close both sockets of ``connection``, with an RST when ``abort``, else a FIN."""
        connection.unregister(self._selector)
        connection.close(reset=abort)
        self._connections.remove(connection)

    def _close_sockets(self) -> None:
        with self._changed:
            if self._closed:
                return
            self._closed = True
            self._closing = True
            self._changed.notify_all()
        for connection in self._connections:
            connection.close(reset=False)
        self._connections.clear()
        for sock in (self._listener, self._wake_reader, self._wake_writer):
            sock.close()
        self._selector.close()


@contextmanager
def fault_proxy(target_host: str, target_port: int) -> Iterator[FaultProxy]:
    """A started ``FaultProxy`` in front of ``target_host``:``target_port``, closed on exit."""
    proxy = FaultProxy(target_host, target_port).start()
    try:
        yield proxy
    finally:
        proxy.close()
