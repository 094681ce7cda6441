"""How the admin lists show a moment and a long text, so they fit a laptop's screen beside the
admin's sidebar: a moment as ``2026-12-03 05:55:58`` in the current time zone (narrower than
Django's ``Dec. 3, 2026, 5:55 a.m.``, and to the second, so an operator can line rows up), a
text cut at a limit with an ellipsis (the detail page shows it whole)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.formats import date_format

__all__ = ["moment", "moment_column", "shortened"]


def moment(value: datetime | None) -> str:
    return "-" if value is None else date_format(timezone.localtime(value), "Y-m-d H:i:s")


def moment_column(field: str, description: str, *, sortable: bool = False) -> Callable[[Any, Any], str]:
    """A ModelAdmin column or detail field showing the datetime ``field`` as ``moment`` does
    (``sortable``: ordered by that field in the list)."""

    @admin.display(description=description, ordering=field if sortable else None)
    def show(model_admin: Any, obj: Any) -> str:
        return moment(getattr(obj, field))

    return show


def shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
