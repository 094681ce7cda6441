"""Job versions: ``@job(version=2, upgrade={1: fn})`` changes a job's arguments while messages of
the old shape are upgraded before the call.

A message carries the version of the code that published it: the ``job_version`` header, set by
``publish()``, or for a direct ``send()`` the option of that name, set by ``VersionedActor`` once,
when the message is made (a retry or a move off a delay queue keeps it); none means 1.
``upgrade[n]`` takes the keyword arguments of a version-``n`` message and returns those of version
``n + 1``; a message of an older version runs every step up to the job's own. What cannot be
fitted (a newer version, a step missing, arguments that still do not fit) raises
``IncompatibleMessageError``; the worker and ``jobs check-compat`` ask the same ``fit``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dramatiq import Actor
from dramatiq.message import Message

from composition.errors import IncompatibleMessageError, PayloadValidationError
from composition.jobs.schema import PayloadSchema
from composition.outbox.publish import VERSION_HEADER, VERSIONS_OPTION

__all__ = ["JobVersions", "Upgrade", "VersionedActor", "message_version"]


Upgrade = Callable[[dict[str, Any]], dict[str, Any]]


def message_version(options: Mapping[str, Any]) -> Any:
    """The version a message says it was published at: its composition headers' (an outbox
    message), else its options' (a direct ``send()``, stamped by ``VersionedActor``), else 1.
    Not checked: ``JobVersions.fit`` refuses one that is not a positive integer."""
    headers = options.get("composition")
    if isinstance(headers, dict) and VERSION_HEADER in headers:
        return headers[VERSION_HEADER]
    return options.get(VERSION_HEADER, 1)


@dataclass(frozen=True)
class JobVersions:
    """A job's version and the upgrades from its older ones."""

    version: int = 1
    upgrades: Mapping[int, Upgrade] = field(default_factory=dict)

    @classmethod
    def of(cls, version: Any, upgrade: Mapping[Any, Any] | None) -> JobVersions:
        """Raises ValueError/TypeError for a version that is not a positive integer, an upgrade
        that is not a callable from an older version, or one whose chain stops short of ``version``."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"version must be an integer >= 1, got {version!r}")
        upgrades = dict(upgrade or {})
        for old, step in upgrades.items():
            if isinstance(old, bool) or not isinstance(old, int) or not 1 <= old < version:
                raise ValueError(f"upgrade keys are the older versions it upgrades from (1 to {version - 1}), "
                                 f"got {old!r}")
            if not callable(step):
                raise TypeError(f"upgrade[{old}] must be a function of the keyword arguments, got {step!r}")
        # Each step must lead on to the job's version: with version=3 and only upgrade[1], every
        # version-1 message would wait out the deploy window and be dead-lettered.
        for old in upgrades:
            if old + 1 < version and old + 1 not in upgrades:
                raise ValueError(f"upgrade[{old}] makes version {old + 1} arguments, and there is no "
                                 f"upgrade[{old + 1}] to take them on to version {version}: declare it, or drop "
                                 f"upgrade[{old}]")
        return cls(version, upgrades)

    def fit(self, schema: PayloadSchema | None, args: Sequence[Any], kwargs: Mapping[str, Any],
            version: Any) -> tuple[Sequence[Any], Mapping[str, Any]]:
        """The arguments to call the job with: ``kwargs`` upgraded from ``version`` and checked
        against ``schema``. Raises ``IncompatibleMessageError``, and whatever an upgrade raises."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise IncompatibleMessageError(f"its {VERSION_HEADER} is not a positive integer: {version!r:.40}")
        if version > self.version:
            raise IncompatibleMessageError(f"published at version {version}, newer than this code's "
                                           f"{self.version} (not yet deployed here?)")
        if version < self.version:
            kwargs = self._upgraded(args, kwargs, version)
        if schema is not None:
            try:
                schema.validate(args, kwargs)
            except PayloadValidationError as exc:
                raise IncompatibleMessageError(str(exc)) from None
        return args, kwargs

    def _upgraded(self, args: Sequence[Any], kwargs: Mapping[str, Any], version: int) -> dict[str, Any]:
        if args:
            raise IncompatibleMessageError(f"published at version {version} with positional arguments, "
                                           "which upgrades cannot name")
        # A copy all the way down: an upgrade may change nested values in place, and the message's
        # own arguments must stay as published (its put-back copies and dead letter carry them).
        upgraded = copy.deepcopy(dict(kwargs))
        for step in range(version, self.version):
            upgrade = self.upgrades.get(step)
            if upgrade is None:
                raise IncompatibleMessageError(f"published at version {version}, and no upgrade from version "
                                               f"{step} is declared")
            upgraded = upgrade(upgraded)
            if not isinstance(upgraded, dict):
                raise IncompatibleMessageError(f"upgrade[{step}] returned {type(upgraded).__name__}, not a dict "
                                               "of keyword arguments")
        return upgraded


class VersionedActor(Actor[Any, Any]):
    """The actor ``@job`` declares: a message it makes for a direct send (``send()``,
    ``send_with_options()``, ``message()``) carries its version when above 1."""

    def message_with_options(self, *, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
                             **options: Any) -> Message[Any]:
        versions = self.options.get(VERSIONS_OPTION)
        if versions is not None and versions.version > 1:
            options.setdefault(VERSION_HEADER, versions.version)
        return super().message_with_options(args=args, kwargs=kwargs, **options)
