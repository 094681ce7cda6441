"""``MessageContext`` wraps each message in connection hygiene and a fresh structlog context
(job_id, actor, attempt, worker, thread, request_id); it sits outside the other job middleware,
so everything they log about a message carries that context."""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import structlog
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware

from composition.jobs.connection_hygiene import close_obsolete_connections, refresh_connections, thread_connections
from composition.jobs.current import attempt_of

__all__ = ["MessageContext"]

# This process, as the heartbeat names it ("host:pid").
_WORKER = f"{socket.gethostname()}:{os.getpid()}"


class MessageContext(Middleware):
    """Fresh database connections and structlog context per message (see module doc)."""

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        refresh_connections()
        # Bound on an empty context: _reset cleared it when this thread's last message ended (a
        # new thread starts with none), so no clear here.
        # Which process and thread ran it: with several worker processes on several hosts, the
        # job id says what happened, the worker says where to look.
        context: dict[str, Any] = {"job_id": message.message_id, "actor": message.actor_name,
                                   "attempt": attempt_of(message), "worker": _WORKER,
                                   "thread": threading.current_thread().name}
        headers = message.options.get("composition")
        if isinstance(headers, dict) and headers.get("request_id"):
            context["request_id"] = headers["request_id"]
        structlog.contextvars.bind_contextvars(**context)

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        self._reset()

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self._reset()

    def before_worker_thread_shutdown(self, broker: Broker, thread: Any) -> None:
        # Closed by the stopping thread itself (Django's connections are per thread), not left to
        # its thread-local storage's collection: a test's in-process run (run_queued_jobs) ends
        # with its test database still to drop, and PostgreSQL refuses to drop one in use.
        for wrapper in thread_connections():
            wrapper.close()

    def _reset(self) -> None:
        structlog.contextvars.clear_contextvars()
        close_obsolete_connections()
