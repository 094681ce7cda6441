"""The checks of the outbox's settings and of how long the records a broker loss reads are kept
(the inbox ledger, the dead letters)."""

from __future__ import annotations

import math
from typing import Any

from django.core.checks import CheckMessage, Error, Warning, register

from composition.checks.common import merged_settings, not_positive_integers, not_positive_seconds
from composition.errors import BrokerConfigurationError
from composition.retention import longest_redelivery_window

__all__ = ["OUTBOX_POSITIVE_INTEGERS", "OUTBOX_POSITIVE_NUMBERS", "RETENTION_PERIODS", "check_outbox_settings",
           "check_retention_settings"]

OUTBOX_POSITIVE_NUMBERS = ("OUTBOX_LEASE_S", "OUTBOX_SWEEP_INTERVAL_S", "OUTBOX_RELAY_BUDGET_S",
                           "OUTBOX_RELAY_TIME_LIMIT_S", "OUTBOX_HELD_DELAY_S", "BROKER_LOSS_CHECK_INTERVAL_S",
                           "BROKER_LOSS_LOOKBACK_S")
OUTBOX_POSITIVE_INTEGERS = ("OUTBOX_MAX_PAYLOAD_BYTES", "OUTBOX_BATCH_SIZE")


@register("composition")
def check_outbox_settings(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    merged = merged_settings()
    if merged is None:
        return []
    messages = not_positive_seconds(merged, OUTBOX_POSITIVE_NUMBERS, "composition.E020")
    messages += not_positive_integers(merged, OUTBOX_POSITIVE_INTEGERS, "composition.E021")
    if not messages and merged["OUTBOX_LEASE_S"] <= merged["OUTBOX_SWEEP_INTERVAL_S"]:
        messages.append(Warning("OUTBOX_LEASE_S should be several OUTBOX_SWEEP_INTERVAL_S, or relays take "
                                "each other's rows and send them twice.", id="composition.W020"))
    if not messages and merged["OUTBOX_RELAY_BUDGET_S"] * 2 > merged["OUTBOX_RELAY_TIME_LIMIT_S"]:
        messages.append(Warning(
            "OUTBOX_RELAY_BUDGET_S should be well below OUTBOX_RELAY_TIME_LIMIT_S (at most half): a relay "
            "round that outlasts its time limit is interrupted between batches and its worker looks stuck.",
            id="composition.W021"))
    if not any(message.is_serious() for message in messages):
        messages += _lookback_beyond_retention(merged)
        messages += _retries_longer_than_held_delay(float(merged["OUTBOX_HELD_DELAY_S"]))
    return messages


# What a broker loss's look-back reads, and what goes wrong when that table is pruned sooner.
_LOOKBACK_READS = {
    "INBOX_RETENTION_S": "jobs whose records were pruned would run again",
    "DEAD_LETTER_RETENTION_S": "jobs whose records were pruned would run again",
    "OUTBOX_RETENTION_S": "jobs whose outbox rows were pruned would never be sent again",
}


def _lookback_beyond_retention(merged: dict[str, Any]) -> list[CheckMessage]:
    """A broker loss's look-back must stay within what the ledger, the dead letters and the
    outbox keep: a job whose ledger row was pruned looks as if it never ran, and would run again;
    a sent row that was pruned is not there to be sent again."""
    lookback_s = float(merged["BROKER_LOSS_LOOKBACK_S"])
    return [Error(f"COMPOSITION['BROKER_LOSS_LOOKBACK_S'] ({lookback_s:g} s) is longer than {key} "
                  f"({float(merged[key]):g} s): after a broker loss, {consequence}.",
                  hint=f"Lower BROKER_LOSS_LOOKBACK_S to {key} or less.", id="composition.E023")
            for key, consequence in _LOOKBACK_READS.items()
            if isinstance(merged[key], int | float) and not isinstance(merged[key], bool) and lookback_s > merged[key]]


def _retries_longer_than_held_delay(held_delay_s: float) -> list[CheckMessage]:
    """A job whose retries wait longer than ``OUTBOX_HELD_DELAY_S``: a retry is no publish, it
    waits on the broker (a RabbitMQ consumer holds it, Redis keeps it in memory)."""
    from composition.broker.configured import configured_broker

    try:
        actors = configured_broker().actors
    except Exception:  # settings the broker cannot be built from: their own checks report them
        return []
    policies = {name: actor.options["job_policy"] for name, actor in actors.items() if "job_policy" in actor.options}
    return [Warning(f"job {name!r} retries up to {policy.max_delay_s:g} s later, longer than OUTBOX_HELD_DELAY_S "
                    f"({held_delay_s:g} s): its retries wait on the broker, not in the outbox.",
                    hint="Lower its max_delay_s, or raise OUTBOX_HELD_DELAY_S within the broker's limits (RabbitMQ's "
                         "consumer_timeout); docs/jobs.md, 'Long delays'.", id="composition.W022")
            for name, policy in sorted(policies.items()) if policy.max_delay_s > held_delay_s]


RETENTION_PERIODS = ("INBOX_RETENTION_S", "OUTBOX_RETENTION_S", "DEAD_LETTER_RETENTION_S", "SCHEDULE_TICK_RETENTION_S",
                     "QUEUE_HISTORY_RETENTION_S", "TASK_RESULT_RETENTION_S")


@register("composition")
def check_retention_settings(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    merged = merged_settings()
    if merged is None:
        return []
    # None is allowed for a period: that table is kept forever.
    periods = tuple(key for key in RETENTION_PERIODS if merged[key] is not None)
    messages = not_positive_seconds(merged, ("RETENTION_INTERVAL_S", *periods), "composition.E060")
    messages += not_positive_integers(merged, ("RETENTION_BATCH_SIZE",), "composition.E061")
    inbox_s = merged["INBOX_RETENTION_S"]
    # The window is built from these two; E004 and E020 report them when they are wrong.
    window_inputs = ("BROKER_HEARTBEAT_TIMEOUT_S", "OUTBOX_LEASE_S")
    if messages or inbox_s is None or not_positive_seconds(merged, window_inputs, "composition.E004"):
        return messages
    try:
        longest = longest_redelivery_window()
    except BrokerConfigurationError:  # reported as E003
        return messages
    if longest is not None and inbox_s < longest[1]:
        actor, window_s = longest
        messages.append(Warning(
            f"COMPOSITION['INBOX_RETENTION_S'] is {inbox_s:g} s, shorter than the redelivery window of job "
            f"{actor!r} ({window_s:g} s: its retry schedule, BROKER_HEARTBEAT_TIMEOUT_S and OUTBOX_LEASE_S); "
            "ledger rows are kept for the window instead.",
            hint=f"Set INBOX_RETENTION_S to at least {math.ceil(window_s)}, or shorten the job's retries.",
            id="composition.W060"))
    return messages
