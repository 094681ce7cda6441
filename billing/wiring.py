"""The composition root: the one place where billing's collaborators are chosen.

``default_service()`` is the service the views and jobs use, built once per process from
``settings.BILLING`` (rebuilt when a test overrides it); ``build_service(**collaborators)``
builds one with some collaborators replaced, as the tests do with another cache alias, other
queues or another email backend.

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
    }
"""

from __future__ import annotations

import functools
from typing import Any

import structlog
from django.conf import settings
from django.core.signals import setting_changed

from billing.collaborators import BillingJobs, BillingMetrics, InvoiceCache, InvoiceLocks
from billing.mail import EmailSender
from billing.services import InvoiceService
from composition.breaker import CircuitBreaker
from composition.cache import get_cache_aside

__all__ = ["DEFAULTS", "build_service", "default_service", "email_sender"]

DEFAULTS: dict[str, Any] = {
    "FROM_EMAIL": "billing@example.com",
    "EMAIL_DOMAIN": "billing.example.com",
    "EMAIL_BACKEND": None,
    "EMAIL_BREAKER_FAILURES": 3,
    "EMAIL_BREAKER_RESET_S": 30.0,
    "CACHE_ALIAS": None,
    "INVOICE_TTL_S": 300.0,
    "LOCK_TIMEOUT_S": 2.0,
}


def _settings() -> dict[str, Any]:
    configured = getattr(settings, "BILLING", None) or {}
    unknown = set(configured) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown BILLING setting(s): {', '.join(sorted(unknown))}")
    return {**DEFAULTS, **configured}


def email_sender(*, backend: str | None = None, **backend_options: Any) -> EmailSender:
    """The email sender of ``settings.BILLING``, or through another ``backend``."""
    options = _settings()
    breaker = CircuitBreaker("email", failure_threshold=int(options["EMAIL_BREAKER_FAILURES"]),
                             reset_timeout_s=float(options["EMAIL_BREAKER_RESET_S"]))
    return EmailSender(from_email=options["FROM_EMAIL"], domain=options["EMAIL_DOMAIN"], breaker=breaker,
                       backend=backend or options["EMAIL_BACKEND"], backend_options=backend_options)


def build_service(**collaborators: Any) -> InvoiceService:
    """An ``InvoiceService`` with the defaults of ``settings.BILLING``, except ``collaborators``
    (any of cache, locks, jobs, metrics, log, mail)."""
    options = _settings()
    defaults: dict[str, Any] = {
        "cache": lambda: InvoiceCache(get_cache_aside(options["CACHE_ALIAS"]), ttl_s=float(options["INVOICE_TTL_S"])),
        "locks": lambda: InvoiceLocks(timeout_s=float(options["LOCK_TIMEOUT_S"])),
        "jobs": BillingJobs,
        "metrics": BillingMetrics,
        "log": lambda: structlog.get_logger("billing"),
        "mail": email_sender,
    }
    unknown = set(collaborators) - set(defaults)
    if unknown:
        raise TypeError(f"unknown collaborator(s): {', '.join(sorted(unknown))}")
    return InvoiceService(**{name: collaborators[name] if name in collaborators else make()
                             for name, make in defaults.items()})


@functools.cache
def default_service() -> InvoiceService:
    """The process's service (its email breaker is the process's too)."""
    return build_service()


def _forget_default(*, setting: str, **kwargs: Any) -> None:
    if setting in ("BILLING", "CACHES", "COMPOSITION", "EMAIL_BACKEND"):
        default_service.cache_clear()


setting_changed.connect(_forget_default)
