"""Jobs as a deploy changes them: which code a process runs is chosen by environment variables,
read at import, so a test runs hosts and commands on old and new code side by side.

``JOBSAPP_CODE`` (tests/scenarios/test_deploys.py): "old" (the default; the test process runs
it), "new" (a breaking change: a required argument added, and a job only it has), "fixed" (the
same change as version 2, whose upgrade covers version 1).

``COMPAT_CODE`` (tests/jobs/test_compatibility.py, bench/bench_check_compat.py): the ten code
changes of #36's acceptance applied to ``compat_job(invoice_id: int, note: str = "")``, five
breaking and five safe; ``compat_other`` never changes.
"""

from __future__ import annotations

import os
from typing import Any

from composition.jobs import job
from tests.jobsapp.models import Effect

DEPLOY_QUEUE = "jobs_deploys"
JOBSAPP_CODE = os.environ.get("JOBSAPP_CODE", "old")

if JOBSAPP_CODE == "old":
    @job(queue=DEPLOY_QUEUE, idempotent=True, max_attempts=1, actor_name="deploy_charge")
    def deploy_charge_old(invoice_id: int) -> None:
        Effect.objects.create(key=f"charge-{invoice_id}-EUR")
elif JOBSAPP_CODE == "new":
    @job(queue=DEPLOY_QUEUE, idempotent=True, max_attempts=1, actor_name="deploy_charge")
    def deploy_charge_new(invoice_id: int, currency: str) -> None:
        Effect.objects.create(key=f"charge-{invoice_id}-{currency}")
else:
    def _with_currency(payload: dict[str, Any]) -> dict[str, Any]:
        return {**payload, "currency": "EUR"}

    @job(queue=DEPLOY_QUEUE, idempotent=True, max_attempts=1, actor_name="deploy_charge", version=2,
         upgrade={1: _with_currency})
    def deploy_charge_fixed(invoice_id: int, currency: str) -> None:
        Effect.objects.create(key=f"charge-{invoice_id}-{currency}")

if JOBSAPP_CODE != "old":
    @job(queue=DEPLOY_QUEUE, idempotent=True, max_attempts=1)
    def deploy_refund(invoice_id: int) -> None:
        Effect.objects.create(key=f"refund-{invoice_id}")


COMPAT_QUEUE = "jobs_compat"
COMPAT_CODE = os.environ.get("COMPAT_CODE", "base")
BREAKING = ("remove", "rename", "add_required", "remove_argument", "change_type")
SAFE = ("add_optional", "rename_with_alias", "reorder", "version_upgrade", "add_job")
COMPAT_CODES = ("base", *BREAKING, *SAFE)
assert COMPAT_CODE in COMPAT_CODES, COMPAT_CODE


@job(queue=COMPAT_QUEUE)
def compat_other(key: str) -> None:
    """Never changes: never reported."""


def _compat(**options: Any) -> Any:
    return job(queue=COMPAT_QUEUE, actor_name=options.pop("actor_name", "compat_job"), **options)


if COMPAT_CODE in ("base", "add_job"):
    @_compat()
    def compat_job(invoice_id: int, note: str = "") -> None:
        """As every message was published."""
elif COMPAT_CODE == "rename":
    @_compat(actor_name="compat_job_renamed")
    def compat_job_renamed(invoice_id: int, note: str = "") -> None:
        """Renamed without an alias."""
elif COMPAT_CODE == "add_required":
    @_compat()
    def compat_job_currency(invoice_id: int, currency: str, note: str = "") -> None:
        """A required argument added."""
elif COMPAT_CODE == "remove_argument":
    @_compat()
    def compat_job_no_note(invoice_id: int) -> None:
        """``note`` removed: only the messages that give one break."""
elif COMPAT_CODE == "change_type":
    @_compat()
    def compat_job_str(invoice_id: str, note: str = "") -> None:
        """``invoice_id`` annotated as another JSON type."""
elif COMPAT_CODE == "add_optional":
    @_compat()
    def compat_job_urgent(invoice_id: int, note: str = "", urgent: bool = False) -> None:
        """An optional argument added."""
elif COMPAT_CODE == "rename_with_alias":
    @_compat(actor_name="compat_job_renamed", aliases=["compat_job"])
    def compat_job_aliased(invoice_id: int, note: str = "") -> None:
        """Renamed, with the old name as an alias."""
elif COMPAT_CODE == "reorder":
    @_compat()
    def compat_job_reordered(*, note: str = "", invoice_id: int) -> None:
        """Keyword arguments reordered."""
elif COMPAT_CODE == "version_upgrade":
    def _invoice_renamed(payload: dict[str, Any]) -> dict[str, Any]:
        return {"invoice": payload["invoice_id"], "note": payload.get("note", "")}

    @_compat(version=2, upgrade={1: _invoice_renamed})
    def compat_job_v2(invoice: int, note: str = "") -> None:
        """``invoice_id`` renamed ``invoice``, version 1 upgraded."""

if COMPAT_CODE == "add_job":
    @_compat(actor_name="compat_new")
    def compat_new(key: str) -> None:
        """A job no message names yet."""
