"""What the checks share: ``COMPOSITION`` over its defaults, and the number checks."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error

from composition.conf import DEFAULTS

__all__ = ["MAX_SETTING_S", "configured_broker_or_none", "merged_settings", "not_positive_integers",
           "not_positive_seconds"]


def merged_settings() -> dict[str, Any] | None:
    """COMPOSITION over the defaults, or None when it is not a dict (reported as E001)."""
    user = getattr(settings, "COMPOSITION", {})
    return {**DEFAULTS, **user} if isinstance(user, dict) else None


def configured_broker_or_none() -> Any:
    """The configured broker, or None when the settings cannot build one: E003 reports that, and
    the checks that read the declared jobs have nothing to read."""
    from composition.broker.configured import configured_broker
    from composition.errors import BrokerConfigurationError

    try:
        return configured_broker()
    except BrokerConfigurationError:
        return None


# No duration setting needs more: a thousand years, as the prune commands' --older-than. Past it
# a date computed from the setting overflows (a retention cutoff raised on every round).
MAX_SETTING_S = 1000 * 365 * 86_400


def not_positive_seconds(merged: dict[str, Any], keys: tuple[str, ...], check_id: str) -> list[CheckMessage]:
    # The comparison refuses nan and inf too: both passed, then failed where they were used (a
    # shed request's Retry-After a 500, every retention round an OverflowError).
    return [Error(f"COMPOSITION[{key!r}] must be a positive number of seconds, at most {MAX_SETTING_S:g} "
                  f"(1000 years), got {merged[key]!r}.", id=check_id)
            for key in keys
            if isinstance(merged[key], bool) or not isinstance(merged[key], int | float)
            or not 0 < merged[key] <= MAX_SETTING_S]


def not_positive_integers(merged: dict[str, Any], keys: tuple[str, ...], check_id: str) -> list[CheckMessage]:
    return [Error(f"COMPOSITION[{key!r}] must be a positive integer, got {merged[key]!r}.", id=check_id)
            for key in keys
            if isinstance(merged[key], bool) or not isinstance(merged[key], int) or merged[key] < 1]
