"""``manage.py outbox``: the outbox's backlog (``status``), its relay run by hand (``relay``),
pruning (``prune``) and jobs taken back before they are sent (``cancel ID...``)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from composition.broker.configured import configured_broker
from composition.errors import BROKER_FAILURES
from composition.jobs.middleware.in_flight import RUNS_WINDOW_S
from composition.management.closed_pipe import reader_may_leave
from composition.management.database_errors import database_must_answer
from composition.management.retention_option import SECONDS_PER_DAY, older_than_days
from composition.outbox import OutboxMessage, cancel
from composition.outbox.maintenance import outbox_status, prune_sent
from composition.outbox.relay import Relay

# Rows claimed and sent in one batch; more is a typo (and past 2**63 not even a number to SQL).
MAX_BATCH_SIZE = 100_000


class Command(BaseCommand):
    help = ("Outbox operations: 'status' shows the backlog (by actor, and by queue as the admin's "
            "operations page shows it), 'relay' relays pending messages until none "
            "is left, 'prune' deletes sent messages older than --older-than days (in batches), "
            "'cancel ID...' takes back the jobs of these outbox rows if no relay has tried to send them.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=("status", "relay", "prune", "cancel"))
        parser.add_argument("ids", nargs="*", metavar="ID",
                            help="cancel: the outbox rows' ids (publish() returns the row)")
        parser.add_argument("--older-than", type=float, default=None, dest="older_than",
                            help="prune: sent messages older than this many days (default OUTBOX_RETENTION_S)")
        parser.add_argument("--dry-run", action="store_true", help="prune: only count what would go")
        parser.add_argument("--batch-size", type=int, default=None, dest="batch_size",
                            help="relay: messages per batch (default OUTBOX_BATCH_SIZE)")
        parser.add_argument("--json", action="store_true", help="print the result as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        with reader_may_leave(), database_must_answer():
            self._handle(options)

    def _handle(self, options: dict[str, Any]) -> None:
        action = options["action"]
        # An option the action does not take is refused, not ignored: `relay --dry-run` relayed.
        for name, takes_it in (("dry_run", "prune"), ("older_than", "prune"), ("batch_size", "relay")):
            if options[name] not in (None, False) and action != takes_it:
                raise CommandError(f"--{name.replace('_', '-')} is for {takes_it} only, not {action}")
        if options["ids"] and action != "cancel":
            raise CommandError(f"ids are for cancel only, not {action}")
        if action == "cancel":
            self._cancel(options["ids"], as_json=options["json"])
            return
        if action == "status":
            # The operations page's window: its per-queue figures are these.
            result: dict[str, Any] = outbox_status(window_s=RUNS_WINDOW_S).as_dict()
        elif action == "relay":
            if options["batch_size"] is not None and not 1 <= options["batch_size"] <= MAX_BATCH_SIZE:
                raise CommandError(f"--batch-size must be between 1 and {MAX_BATCH_SIZE}")
            relay = Relay(configured_broker(), batch_size=options["batch_size"])
            try:
                result = {"relayed": relay.run_until_idle(), "relay_id": relay.relay_id}
            except BROKER_FAILURES as exc:
                # What this command is run for (the broker was away); the batch under way went
                # back to pending, as the relay leaves every batch it could not send.
                raise CommandError(f"the broker did not take the messages ({type(exc).__name__}: {exc}); "
                                   f"{outbox_status().pending} still pending, none lost: run this again once "
                                   "the broker answers") from exc
        else:
            days = older_than_days(options["older_than"], "OUTBOX_RETENTION_S")
            deleted = prune_sent(days * SECONDS_PER_DAY, dry_run=options["dry_run"])
            result = {"would_delete" if options["dry_run"] else "deleted": deleted, "older_than_days": days}
        if options["json"]:
            self.stdout.write(json.dumps(result, indent=2, default=str))
            return
        for name, value in result.items():
            if isinstance(value, dict):
                self.stdout.write(f"{name}:")
                for inner, count in value.items():
                    if isinstance(count, dict):  # a queue's backlog: pending=1 oldest_pending_age_s=0.5 ...
                        count = " ".join(f"{key}={figure}" for key, figure in count.items())
                    self.stdout.write(f"  {inner}: {count}")
            else:
                self.stdout.write(f"{name}: {value}")

    def _cancel(self, ids: list[str], *, as_json: bool) -> None:
        if not ids:
            raise CommandError("cancel takes the ids of outbox rows: manage.py outbox cancel ID [ID ...]")
        if wrong := [text for text in ids if not text.isdecimal()]:
            raise CommandError(f"not an outbox row id: {wrong[0]!r}")
        results = []
        for pk in dict.fromkeys(int(text) for text in ids):  # each once, in the order given
            row = OutboxMessage.objects.filter(pk=pk).only("actor_name", "status").first()
            cancelled = row is not None and cancel(pk)
            said = f"cancelled ({row.actor_name}, was {row.status})" if cancelled and row else _why_not(pk)
            results.append({"id": pk, "cancelled": cancelled, "said": said})
            if not as_json:
                self.stdout.write(f"{pk}: {said}")
        if as_json:
            self.stdout.write(json.dumps(results, indent=2))
        if missed := sum(not result["cancelled"] for result in results):
            raise CommandError(f"{missed} of {len(results)} not cancelled")


def _why_not(pk: int) -> str:
    """Why ``cancel(pk)`` took nothing, as the row reads now."""
    row = OutboxMessage.objects.filter(pk=pk).only("status", "sent_at", "claimed_until").first()
    if row is None:
        return "not cancelled, no such outbox row (cancelled already, purged, or sent and pruned)"
    if row.status == OutboxMessage.Status.SENT and row.sent_at is not None:
        return f"not cancelled, sent at {row.sent_at.isoformat(timespec='seconds')}"
    if row.claimed_until is not None and row.claimed_until > timezone.now():
        return f"not cancelled, a relay is sending it (leased until {row.claimed_until.isoformat(timespec='seconds')})"
    return "not cancelled, a relay tried to send it: it may be on the broker, and a relay sends it again"
