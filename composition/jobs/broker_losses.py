"""When the Redis broker loses its data: idempotent jobs reconciled from the inbox ledger.

The outbox marks a row sent once the broker took it; from then on the job lives only on the
broker. A Redis broker restarted without its data, flushed, or failed over to an empty replica
loses it, and nothing else would notice. ``BrokerLossReconciler``, in every ``runworkers``
process, every ``BROKER_LOSS_CHECK_INTERVAL_S``:

- checks the broker's epoch: a token the first check writes into the broker (``EPOCH_KEY``) and
  records as a ``BrokerEpoch``. When the broker no longer holds the latest epoch's token, its
  data was lost: a new epoch begins, marked ``lost``, under a transaction-scoped advisory lock,
  so one process records it (none is held across transactions: safe behind PgBouncer);
- for each lost epoch still open, takes the outbox rows sent before it (within
  ``BROKER_LOSS_LOOKBACK_S``) of idempotent jobs, once their job's whole redelivery window has
  passed since their due time (so a retry waiting out its backoff, a limit's or a deploy's wait,
  is never sent a second time), claimed with ``SKIP LOCKED``; each row is looked at once per
  loss. Those with neither a ledger row nor a dead letter are made pending again: the relay
  sends them under their message id, and the ledger makes a duplicate harmless. Rows of a paused
  (or shed) queue wait until it is resumed (this process's copy of the pauses, which runworkers'
  refresher keeps). The epoch closes once the longest window has passed.

Plain jobs and ``django.tasks`` tasks with ``ATOMIC: False`` write no ledger row with their
effects: they are outside this promise. Presence on the broker is never checked: Redis keys a
message by a per-enqueue id. A loss the token survives (a replica that missed only the last
writes) is not detected.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

import structlog
from django.db import close_old_connections, connection, transaction
from django.db.models import F
from django.utils import timezone
from dramatiq.broker import Broker

from composition.broker.pausing import paused_queues
from composition.conf import conf
from composition.jobs.inbox import ledger_key_of
from composition.jobs.models import BrokerEpoch, DeadLetter, ProcessedMessage
from composition.jobs.policy import JobPolicy, redelivery_window_s
from composition.lifecycle.periodic import PeriodicComponent
from composition.metrics import BROKER_LOSSES, OUTBOX_RESENT
from composition.outbox.models import OutboxMessage, message_id_for

__all__ = ["EPOCH_KEY", "BrokerLossReconciler", "check_epoch", "idempotent_windows", "reconcile"]

log = structlog.get_logger("composition.jobs")

# Outside Dramatiq's namespace: emptying the broker's queues leaves it.
EPOCH_KEY = "composition:broker-epoch"
# pg_advisory_xact_lock's key for the epoch check: "composition broker epoch".
_EPOCH_LOCK = 0x636F6D70_65706F63
# Rows looked at per statement.
_BATCH = 500

_CANDIDATES_SQL = """
SELECT o.id, o.actor_name, o.headers
FROM {outbox} o
JOIN (SELECT unnest(%(actors)s::text[]) AS actor_name, unnest(%(windows)s::float8[]) AS window_s) w
  ON w.actor_name = o.actor_name
WHERE o.status = 'sent' AND o.sent_at < %(began)s AND o.sent_at >= %(since)s
  AND o.reconciled_after_loss IS DISTINCT FROM %(epoch)s
  AND o.queue_name <> ALL(%(paused)s::text[])
  AND GREATEST(o.sent_at, coalesce(o.due_at, o.created_at + make_interval(secs => coalesce(o.delay_s, 0))))
      + make_interval(secs => w.window_s) < statement_timestamp()
ORDER BY o.id
LIMIT %(limit)s
FOR UPDATE OF o SKIP LOCKED
"""


def check_epoch(client: Any) -> BrokerEpoch | None:
    """Compare the broker's epoch token (``client``: the broker's Redis) with the latest epoch's;
    begin a new epoch when they differ. Returns it when that is a detected loss."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_EPOCH_LOCK])
        latest = BrokerEpoch.objects.order_by("-id").first()
        held = client.get(EPOCH_KEY)
        if latest is not None and held is not None and held.decode() == latest.token:
            return None
        epoch = BrokerEpoch.objects.create(token=secrets.token_hex(16), lost=latest is not None)
        client.set(EPOCH_KEY, epoch.token)
    if not epoch.lost:
        return None
    BROKER_LOSSES.inc()
    log.error("the broker's data was lost (its epoch token is gone): idempotent jobs sent before now are sent "
              "again once their redelivery window has passed, if they never ran", epoch=epoch.pk)
    return epoch


def idempotent_windows(broker: Broker) -> dict[str, float]:
    """Each idempotent job's whole redelivery window (``jobs.policy.redelivery_window_s``)."""
    heartbeat_timeout_s, lease_s = float(conf.BROKER_HEARTBEAT_TIMEOUT_S), float(conf.OUTBOX_LEASE_S)
    return {name: redelivery_window_s(policy, heartbeat_timeout_s=heartbeat_timeout_s, lease_s=lease_s)
            for name, actor in broker.actors.items()
            if isinstance(policy := actor.options.get("job_policy"), JobPolicy) and policy.idempotent}


def reconcile(epoch: BrokerEpoch, windows: Mapping[str, float], *, paused: Iterable[str] = (),
              limit: int = _BATCH) -> tuple[int, int]:
    """One batch of ``epoch``'s reconciliation (see module doc): (rows looked at, rows made
    pending again). Fewer looked at than ``limit``: nothing more is due now."""
    if not windows:
        return 0, 0
    since = epoch.began_at - timedelta(seconds=float(conf.BROKER_LOSS_LOOKBACK_S))
    outbox = connection.ops.quote_name(OutboxMessage._meta.db_table)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_CANDIDATES_SQL.format(outbox=outbox), {
                "actors": list(windows), "windows": list(windows.values()), "began": epoch.began_at,
                "since": since, "epoch": epoch.pk, "paused": sorted(paused), "limit": limit})
            rows = cursor.fetchall()
        if not rows:
            return 0, 0
        message_ids = {pk: message_id_for(pk) for pk, _, _ in rows}
        ledger_keys = {pk: ledger_key_of(headers, message_ids[pk]) for pk, _, headers in rows}
        ran = set(ProcessedMessage.objects.filter(message_id__in=ledger_keys.values())
                  .values_list("message_id", flat=True))
        failed = set(DeadLetter.objects.filter(message_id__in=message_ids.values())
                     .values_list("message_id", flat=True))
        lost = [(pk, actor) for pk, actor, _ in rows if ledger_keys[pk] not in ran and message_ids[pk] not in failed]
        OutboxMessage.objects.filter(pk__in=[pk for pk, _, _ in rows]).update(reconciled_after_loss=epoch.pk)
        if lost:
            OutboxMessage.objects.filter(pk__in=[pk for pk, _ in lost]).update(
                status=OutboxMessage.Status.PENDING, sent_at=None, claimed_until=None, claimed_by="",
                last_error=f"sent again: the broker lost its data (epoch {epoch.pk})")
            BrokerEpoch.objects.filter(pk=epoch.pk).update(resent=F("resent") + len(lost))
    for _, actor in lost:
        OUTBOX_RESENT.labels(actor).inc()
    if lost:
        log.warning("outbox rows sent again after a loss of the broker's data", epoch=epoch.pk, count=len(lost),
                    outbox_ids=[pk for pk, _ in lost])
    return len(rows), len(lost)


class BrokerLossReconciler(PeriodicComponent):
    """The periodic check and reconciliation of the module doc, for a Redis ``broker``."""

    name = "broker-losses"
    depends_on = ("database", "broker")
    interval_setting = "BROKER_LOSS_CHECK_INTERVAL_S"
    failure_event = "broker loss check failed"
    logger = log

    def __init__(self, broker: Broker, *, interval_s: float | None = None) -> None:
        super().__init__(interval_s=interval_s)
        self.broker = broker

    def tick(self) -> bool:
        close_old_connections()
        check_epoch(self.broker.client)  # type: ignore[attr-defined]
        more = False
        windows = idempotent_windows(self.broker)
        longest_s = max(windows.values(), default=0.0)
        for epoch in BrokerEpoch.objects.filter(lost=True, closed_at__isnull=True).order_by("id"):
            looked_at, _ = reconcile(epoch, windows, paused=paused_queues.names)
            more = more or looked_at == _BATCH
            # Every row sent before the loss is past its window: what is left never ran and is
            # in a paused queue, or it is there still; the epoch stays open for those.
            if looked_at == 0 and timezone.now() > epoch.began_at + timedelta(seconds=longest_s) \
                    and not paused_queues.names:
                BrokerEpoch.objects.filter(pk=epoch.pk).update(closed_at=timezone.now())
        return more
