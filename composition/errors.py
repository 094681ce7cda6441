"""The exception tree shared by every part of composition.

Configuration mistakes are kept apart from runtime failures, so callers can catch the one
without hiding the other.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

__all__ = [
    "BrokerConfigurationError",
    "CompositionError",
    "ConfigurationError",
    "ComponentError",
    "SystemStartError",
]


class CompositionError(Exception):
    """Base class of every error raised by composition."""


class ConfigurationError(CompositionError, ImproperlyConfigured):
    """A setting is missing, malformed or names something that cannot be loaded."""


class BrokerConfigurationError(ConfigurationError):
    """The broker URL or broker options are unusable."""


class ComponentError(CompositionError):
    """A component of a System failed; ``component`` names it."""

    def __init__(self, component: str, message: str) -> None:
        super().__init__(f"component {component!r}: {message}")
        self.component = component


class SystemStartError(ComponentError):
    """A component failed to start; the components started before it were stopped again.

    ``rollback`` is the stop report of that rollback, in the order the stops ran.
    """

    def __init__(self, component: str, cause: BaseException, rollback: list) -> None:  # type: ignore[type-arg]
        super().__init__(component, f"failed to start: {type(cause).__name__}: {cause}")
        self.cause = cause
        self.rollback = rollback
