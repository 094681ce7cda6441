"""How the admin lists show a moment and a long text, so they fit a laptop's screen beside the
admin's sidebar: a moment as ``2026-12-03 05:55:58`` in the current time zone (narrower than
Django's ``Dec. 3, 2026, 5:55 a.m.``, and to the second, so an operator can line rows up), a
text cut at a limit with an ellipsis (the detail page shows it whole)."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone
from django.utils.formats import date_format

__all__ = ["moment", "shortened"]


def moment(value: datetime | None) -> str:
    return "-" if value is None else date_format(timezone.localtime(value), "Y-m-d H:i:s")


def shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
