"""``VersionStamps``: a message sent straight through Dramatiq (``send()``, not ``publish()``) to
a job of version 2 or more carries that version, so a worker never upgrades a payload that is
already of the new shape. An outbox message carries the version its publisher's code declared
in its headers (``composition.outbox.publish``), and is left alone here: the relay that enqueues
it may run newer code than the publisher did."""

from __future__ import annotations

from typing import Any

from dramatiq.broker import Broker
from dramatiq.message import Message
from dramatiq.middleware import Middleware

from composition.jobs.versions import JobVersions
from composition.outbox.publish import VERSION_HEADER, VERSIONS_OPTION

__all__ = ["VersionStamps"]


class VersionStamps(Middleware):
    @property
    def actor_options(self) -> set[str]:
        return {VERSIONS_OPTION}

    def before_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        options = message.options
        if "composition" in options or VERSION_HEADER in options:
            return
        actor = broker.actors.get(message.actor_name)
        versions: JobVersions | None = None if actor is None else actor.options.get(VERSIONS_OPTION)
        if versions is not None and versions.version > 1:
            options[VERSION_HEADER] = versions.version
