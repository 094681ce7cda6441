"""``EmailSender``: billing's outgoing mail through Django's email framework, behind a
``CircuitBreaker``, each message with a ``Message-ID`` derived from what it is about.

An email is an effect outside the database, so a job that sends one cannot make it exactly once:
a worker that dies after the backend accepted the message and before its transaction committed
runs the job again, and the customer gets the receipt twice. The ``Message-ID`` is the same both
times (it is derived from the receipt number, not made fresh), so a mail server or client that
deduplicates on it shows one, and anyone counting can tell a repeat from a second receipt.

While the email backend keeps failing the breaker opens, and the jobs fail fast with
``CircuitOpen`` (a transient error: they retry with backoff) instead of each waiting for an SMTP
timeout; after ``reset_timeout_s`` one trial send decides whether it closes again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.mail import EmailMessage, get_connection

from composition.breaker import CircuitBreaker

__all__ = ["EmailSender"]


class EmailSender:
    """Sends one message at a time through ``backend`` (a dotted path; None: ``EMAIL_BACKEND``),
    guarded by ``breaker``. ``domain`` ends every Message-ID this sender derives."""

    def __init__(self, *, from_email: str, breaker: CircuitBreaker, domain: str, backend: str | None = None,
                 backend_options: dict[str, Any] | None = None) -> None:
        self.from_email = from_email
        self.breaker = breaker
        self.domain = domain
        self.backend = backend
        self.backend_options = dict(backend_options or {})

    def message_id(self, kind: str, reference: str) -> str:
        """The Message-ID of the one email about ``reference`` (a receipt number, a job id)."""
        safe = "".join(char if char.isalnum() or char in "-._" else "_" for char in reference)
        return f"<{kind}.{safe}@{self.domain}>"

    def send(self, *, to: Sequence[str], subject: str, body: str, message_id: str) -> None:
        """Hand one message to the backend; raises its error, or ``CircuitOpen`` while the
        breaker is open."""

        def deliver() -> None:
            # The connection is made inside the breaker: a backend that cannot even be set up
            # (a missing folder, a bad host) is a failure like any other.
            connection = get_connection(self.backend, fail_silently=False, **self.backend_options)
            EmailMessage(subject=subject, body=body, from_email=self.from_email, to=list(to),
                         headers={"Message-ID": message_id}, connection=connection).send()

        self.breaker.call(deliver)
