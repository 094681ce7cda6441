"""The check of the queue names the settings use, against the queues the declared jobs use: a
misspelt name there does nothing and says nothing."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Warning, register

from composition.checks.common import configured_broker_or_none, merged_settings
from composition.jobs.queue_order import QueueOrder
from composition.outbox.relay import RELAY_QUEUE_NAME
from composition.sampling.queues import declared_queues

__all__ = ["check_queue_names"]

# The settings that name queues, and what a name no job uses costs there.
_NAMING = {
    "BACKPRESSURE_QUEUES": "its limit guards nothing",
    "SHED_QUEUES": "nothing is shed",
    "SHED_ESSENTIAL_QUEUES": "its pressure is never measured",
}


def _names(value: Any) -> list[str]:
    if isinstance(value, dict | list | tuple):
        return [name for name in value if isinstance(name, str)]
    return []  # a malformed value: the setting's own check reports it


@register("composition")
def check_queue_names(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    merged = merged_settings()
    if merged is None:
        return []
    broker = configured_broker_or_none()
    if broker is None:
        return []
    # The relay's queue too: its actor is declared on first use, and every worker consumes it.
    declared = {*declared_queues(broker), RELAY_QUEUE_NAME}
    known = ", ".join(sorted(declared - {RELAY_QUEUE_NAME})) or "none is declared"
    messages: list[CheckMessage] = []
    for key, cost in _NAMING.items():
        unknown = sorted(set(_names(merged[key])) - declared)
        if unknown:
            messages.append(Warning(f"COMPOSITION[{key!r}] names {unknown}, which no job uses: {cost}.",
                                    hint=f"The queues of the declared jobs: {known}.", id="composition.W053"))
    try:
        order = None if merged["WORKER_QUEUES"] is None else QueueOrder.parse(merged["WORKER_QUEUES"])
    except (ValueError, TypeError):
        return messages  # E012
    if order is not None:
        if unknown := sorted(set(order.names) - declared):
            messages.append(Error(f"COMPOSITION['WORKER_QUEUES'] names {unknown}, which no job uses: runworkers "
                                  "refuses to start with it.", hint=f"The queues of the declared jobs: {known}.",
                                  id="composition.E017"))
        if left_out := sorted(declared - set(order.names) - {RELAY_QUEUE_NAME}):
            messages.append(Warning(
                f"COMPOSITION['WORKER_QUEUES'] leaves out {left_out}: a runworkers started without --queues "
                "never runs their jobs.",
                hint="Add them, or silence this check if other workers run them (runworkers --queues ...).",
                id="composition.W018"))
    return messages
