"""The composition root: the one place where billing's service is given its objects.

``default_service()`` is the service the views and jobs use, built once per process from
``settings.BILLING`` (rebuilt when a test overrides it); ``build_service(**fields)`` builds one
with some of ``InvoiceService``'s fields replaced, as the tests do with another cache alias,
a receipt job on another queue or another email backend.

``settings.BILLING`` (every key optional)::

    BILLING = {
        "FROM_EMAIL": "billing@example.com",   # sender of receipts and reminders
        "EMAIL_DOMAIN": "billing.example.com",  # ends every Message-ID
        "EMAIL_BACKEND": None,                  # a dotted path; None: Django's EMAIL_BACKEND
        "EMAIL_BREAKER_FAILURES": 3,            # consecutive failures that open the email breaker
        "EMAIL_BREAKER_RESET_S": 30.0,          # how long it stays open before a trial send
        "CACHE_ALIAS": None,                    # None: COMPOSITION["CACHE_ALIAS"]
        "INVOICE_TTL_S": 300.0,
        "LOCK_TIMEOUT_S": 2.0,
        "REMINDER_AFTER_DAYS": 14,              # open this long: reminded by the morning sweep
    }
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import structlog
from django.conf import settings
from django.core.signals import setting_changed

from billing.mail import EmailSender
from billing.metrics import METRICS
from billing.services import InvoiceService
from composition.breaker import CircuitBreaker
from composition.cache import get_cache_aside
from composition.locks import row_lock
from composition.outbox import publish, publish_many

__all__ = ["DEFAULTS", "build_service", "default_service", "email_sender", "setting"]

DEFAULTS: dict[str, Any] = {
    "FROM_EMAIL": "billing@example.com",
    "EMAIL_DOMAIN": "billing.example.com",
    "EMAIL_BACKEND": None,
    "EMAIL_BREAKER_FAILURES": 3,
    "EMAIL_BREAKER_RESET_S": 30.0,
    "CACHE_ALIAS": None,
    "INVOICE_TTL_S": 300.0,
    "LOCK_TIMEOUT_S": 2.0,
    "REMINDER_AFTER_DAYS": 14,
}


def _settings() -> dict[str, Any]:
    configured = getattr(settings, "BILLING", None) or {}
    unknown = set(configured) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown BILLING setting(s): {', '.join(sorted(unknown))}")
    return {**DEFAULTS, **configured}


def setting(name: str) -> Any:
    """One key of ``settings.BILLING``, or its default."""
    return _settings()[name]


def email_sender(*, backend: str | None = None, **backend_options: Any) -> EmailSender:
    """The email sender of ``settings.BILLING``, or through another ``backend``."""
    options = _settings()
    breaker = CircuitBreaker("email", failure_threshold=int(options["EMAIL_BREAKER_FAILURES"]),
                             reset_timeout_s=float(options["EMAIL_BREAKER_RESET_S"]))
    return EmailSender(from_email=options["FROM_EMAIL"], domain=options["EMAIL_DOMAIN"], breaker=breaker,
                       backend=backend or options["EMAIL_BACKEND"], backend_options=backend_options)


def build_service(**fields: Any) -> InvoiceService:
    """An ``InvoiceService`` with the defaults of ``settings.BILLING``, except ``fields`` (any of
    ``InvoiceService``'s: cache, lock, publish, metrics, log, mail, invoice_ttl_s, ...)."""
    unknown = set(fields) - set(InvoiceService.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown InvoiceService field(s): {', '.join(sorted(unknown))}")
    options = _settings()
    defaults: dict[str, Callable[[], Any]] = {
        "cache": lambda: get_cache_aside(options["CACHE_ALIAS"]),
        "lock": lambda: row_lock,
        "publish": lambda: publish,
        "publish_many": lambda: publish_many,
        "metrics": lambda: METRICS,
        "log": lambda: structlog.get_logger("billing"),
        "mail": email_sender,
        "invoice_ttl_s": lambda: float(options["INVOICE_TTL_S"]),
        "lock_timeout_s": lambda: float(options["LOCK_TIMEOUT_S"]),
    }
    return InvoiceService(**{name: make() for name, make in defaults.items() if name not in fields}, **fields)


@functools.cache
def default_service() -> InvoiceService:
    """The process's service (its email breaker is the process's too)."""
    return build_service()


def _forget_default(*, setting: str, **kwargs: Any) -> None:
    if setting in ("BILLING", "CACHES", "COMPOSITION", "EMAIL_BACKEND"):
        default_service.cache_clear()


setting_changed.connect(_forget_default)
