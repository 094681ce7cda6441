"""Structured logs: structlog configured once, request ids bound per request.

``logging_config(fmt, level)`` returns a ``LOGGING`` dict that sends the standard library's
records (Django, Dramatiq, gunicorn) through the same structlog renderer, so every line is one
JSON object (or one readable console line) carrying whatever is bound in the context:
request_id, job_id, attempt, entity ids.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import structlog
from django.http import HttpRequest, HttpResponse
from dramatiq.middleware import Shutdown

from composition.conf import require_installed

__all__ = [
    "REQUEST_ID_HEADER",
    "LevelCap",
    "RequestIdMiddleware",
    "ShutdownIsNoFailure",
    "already_logged",
    "configure_structlog",
    "log_thread_deaths",
    "logging_config",
]

REQUEST_ID_HEADER = "X-Request-ID"
# Accept what proxies commonly send (uuids, hex, dotted trace ids), refuse anything that could
# smuggle newlines or blow up log lines.
_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # whole value: fullmatch ($ takes a "\n")

def _add_pid(logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    # Which process wrote it: `runworkers --processes N`'s supervisor and children, and ./run's
    # children, write the same lines (a component's start or stop) to one stream.
    event_dict.setdefault("pid", os.getpid())
    return event_dict


_SHARED_PROCESSORS: list[Any] = [
    structlog.contextvars.merge_contextvars,
    _add_pid,
    structlog.stdlib.add_logger_name,
    structlog.stdlib.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.StackInfoRenderer(),
]


def _request_id_of_record(logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """The request id of a standard-library record that names its request (``django.request``
    logs a 4xx/5xx after the middleware has returned, when the id is no longer bound)."""
    if "request_id" not in event_dict:
        request_id = getattr(getattr(event_dict.get("_record"), "request", None), "request_id", None)
        if isinstance(request_id, str):
            event_dict["request_id"] = request_id
    return event_dict


R = TypeVar("R", bound=HttpResponse)


def already_logged(response: R) -> R:
    """Mark ``response`` as logged by its view or middleware, so that Django's ``django.request``
    does not log it again at error level: a 503 that sheds load or answers a readiness probe is
    expected, and its own warning says why."""
    response._has_been_logged = True  # type: ignore[attr-defined]  # what django.utils.log.log_response reads
    return response


def _renderer(fmt: str) -> Any:
    if fmt == "console":
        return structlog.dev.ConsoleRenderer(colors=False)
    return structlog.processors.JSONRenderer()


class ShutdownIsNoFailure(logging.Filter):
    """Drops Dramatiq's "Failed to process message ... with unhandled exception" for a job a drain
    interrupted: an error with a traceback on every busy thread of every deploy, for a job that is
    requeued without using an attempt (which the job middleware logs, once, as what it is)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], Shutdown))


class LevelCap(logging.Filter):
    """Lowers records of its logger whose message starts with ``prefix`` to ``level`` (and, with
    ``traceback=False``, drops their traceback): for lines other libraries log as errors that are
    routine here, so that error level keeps meaning "look at this"."""

    def __init__(self, level: str = "WARNING", prefix: str = "", traceback: bool = True) -> None:
        super().__init__()
        self.levelno = logging.getLevelName(level)
        self.prefix = prefix
        self.traceback = traceback

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > self.levelno and str(record.msg).startswith(self.prefix):
            record.levelno, record.levelname = self.levelno, logging.getLevelName(self.levelno)
            if not self.traceback:
                record.exc_info = record.exc_text = None
        return True


def logging_config(fmt: str = "json", level: str = "INFO") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` dict that renders every record through structlog.

    Two lines logged as errors by others are warnings here: Dramatiq's "Failed to process
    message" for every failed attempt (composition logs the outcome itself: a retry is a warning,
    the dead letter an error), and Django's ``DisallowedHost`` (a scanner's bad Host header, one
    traceback each)."""
    processors: list[Any] = [structlog.stdlib.ProcessorFormatter.remove_processors_meta]
    if fmt != "console":
        processors.append(structlog.processors.format_exc_info)
    processors.append(_renderer(fmt))
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "structlog": {
                "()": structlog.stdlib.ProcessorFormatter,
                "processors": processors,
                "foreign_pre_chain": [*_SHARED_PROCESSORS, _request_id_of_record],
            },
        },
        "filters": {
            "attempt_failures": {"()": LevelCap, "prefix": "Failed to process message"},
            "disallowed_hosts": {"()": LevelCap, "traceback": False},
        },
        "handlers": {
            "default": {"class": "logging.StreamHandler", "formatter": "structlog"},
        },
        "root": {"handlers": ["default"], "level": level},
        "loggers": {
            "django.server": {"level": "WARNING"},
            "django.security.DisallowedHost": {"filters": ["disallowed_hosts"]},
            "dramatiq": {"level": level},
            "dramatiq.worker.WorkerThread": {"filters": ["attempt_failures"]},
        },
    }


def log_thread_deaths() -> None:
    """A thread that dies of an exception is logged (critical, with its traceback, as one line)
    instead of Python's default, which writes the traceback as plain text lines among the JSON
    ones. Only when no other hook is installed."""
    if threading.excepthook is not threading.__excepthook__:
        return

    def excepthook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        structlog.get_logger("composition.threads").critical(
            "thread died of an exception", thread=args.thread.name if args.thread else None,
            exc_info=(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback))

    threading.excepthook = excepthook


def configure_structlog() -> None:
    """Route structlog's loggers through the standard library (configured by ``logging_config``)."""
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_SHARED_PROCESSORS,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.UnicodeDecoder(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def clean_request_id(value: str | None) -> str:
    """The caller's request id when well formed, otherwise a new one."""
    if value and _REQUEST_ID_RE.fullmatch(value):
        return value
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """Binds ``request_id`` to the log context for one request and echoes it in the response."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        require_installed("composition.logging.RequestIdMiddleware")
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = clean_request_id(request.headers.get(REQUEST_ID_HEADER))
        request.request_id = request_id  # type: ignore[attr-defined]
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            response = self.get_response(request)
        finally:
            # Threads serve many requests: nothing may leak into the next one.
            structlog.contextvars.clear_contextvars()
        response[REQUEST_ID_HEADER] = request_id
        return response
