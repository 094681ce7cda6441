"""When the Redis broker loses messages: idempotent jobs reconciled from the inbox ledger.

``BrokerLossReconciler`` (every ``runworkers`` process, each ``BROKER_LOSS_CHECK_INTERVAL_S``)
tells a loss by the epoch token the first check wrote into the broker being gone (every queue),
or by a queue's counts (``composition.jobs.shortfalls``: that queue), and records it once as a
lost ``BrokerEpoch`` under a transaction-scoped advisory lock. For an open lost epoch it makes
pending again the idempotent rows sent before it that never ran (no ledger row, no dead letter),
once their whole redelivery window has passed since their due time, each once per loss, a paused
queue's when it is resumed. What a changer must keep: a row still inside its window is never sent
again (a retry waiting out its backoff would start a second chain). docs/jobs.md has the rest.
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
from composition.jobs.models import BrokerEpoch
from composition.jobs.policy import JobPolicy, redelivery_window_s
from composition.jobs.shortfalls import Shortfall, never_ran, short_queue
from composition.lifecycle.periodic import PeriodicComponent
from composition.metrics import BROKER_LOSSES, OUTBOX_RESENT
from composition.outbox.models import OutboxMessage

__all__ = ["COUNT_CHECK_KEY", "EPOCH_KEY", "BrokerLossReconciler", "check_counts", "check_epoch", "idempotent_windows",
           "reconcile"]

log = structlog.get_logger("composition.jobs")

# Outside Dramatiq's namespace: emptying the broker's queues leaves it.
EPOCH_KEY = "composition:broker-epoch"
# Held for an interval by the process that counts (one count per interval across the cluster:
# each reads a few hundred rows per queue).
COUNT_CHECK_KEY = "composition:broker-count-check"
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
  AND (%(queue)s = '' OR o.queue_name = %(queue)s)
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
    # Every worker process looks each tick: when the token is there, as it nearly always is, that
    # is one SELECT and one GET, with no transaction and no lock held across the Redis call.
    # Only a difference takes the lock, and _begin_epoch looks again under it.
    if _token_kept(client, BrokerEpoch.objects.order_by("-id").first()):
        return None
    return _begin_epoch(client)


def _token_kept(client: Any, latest: BrokerEpoch | None) -> bool:
    """Whether the broker holds the token of ``latest``, the latest epoch."""
    if latest is None:
        return False
    held = client.get(EPOCH_KEY)
    return held is not None and held.decode() == latest.token


def _begin_epoch(client: Any, shortfall: Shortfall | None = None) -> BrokerEpoch | None:
    """Under the epoch lock, begin an epoch, its token written into the broker: when the broker
    no longer holds the latest epoch's token (every queue lost its data), or else, given a
    queue's ``shortfall``, when no lost epoch is open (another process may have seen it first).
    Returns the new epoch when it is a detected loss."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_EPOCH_LOCK])
        latest = BrokerEpoch.objects.order_by("-id").first()
        if _token_kept(client, latest):
            if shortfall is None or BrokerEpoch.objects.filter(lost=True, closed_at__isnull=True).exists():
                return None
            epoch = BrokerEpoch.objects.create(token=secrets.token_hex(16), lost=True, cause=str(shortfall),
                                               queue=shortfall.queue)
        else:
            epoch = BrokerEpoch.objects.create(token=secrets.token_hex(16), lost=latest is not None,
                                               cause="" if latest is None else "its epoch token was gone")
        client.set(EPOCH_KEY, epoch.token)
    if not epoch.lost:
        return None
    BROKER_LOSSES.inc()
    if epoch.queue:
        log.error("the broker lost messages of a queue (it holds fewer than its sent jobs that have not run): its "
                  "idempotent jobs sent before now are sent again once their redelivery window has passed, if "
                  "they never ran", epoch=epoch.pk, cause=epoch.cause)
    else:
        log.error("the broker's data was lost (its epoch token is gone): idempotent jobs sent before now are sent "
                  "again once their redelivery window has passed, if they never ran", epoch=epoch.pk)
    return epoch


def check_counts(client: Any, namespace: str, queues: Mapping[str, Iterable[str]], *,
                 once_per_s: float = 0.0) -> BrokerEpoch | None:
    """``short_queue``, unless a lost epoch is open (its own shortfall lasts until it has sent its
    rows again) or none began yet, or (``once_per_s``) another process of the cluster counted
    within that time; a shortfall begins a lost epoch of its queue, returned, or of every queue
    when the broker lost its token too (a wipe seen first by its counts)."""
    if not queues or not BrokerEpoch.objects.exists() \
            or BrokerEpoch.objects.filter(lost=True, closed_at__isnull=True).exists():
        return None
    if once_per_s > 0 and not client.set(COUNT_CHECK_KEY, "1", nx=True, px=max(1, round(once_per_s * 1000))):
        return None
    shortfall = short_queue(client, namespace, queues)
    return _begin_epoch(client, shortfall) if shortfall is not None else None


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
                "since": since, "epoch": epoch.pk, "queue": epoch.queue, "paused": sorted(paused), "limit": limit})
            rows = cursor.fetchall()
        if not rows:
            return 0, 0
        actors = {pk: actor for pk, actor, _ in rows}
        lost = [(pk, actors[pk]) for pk in never_ran((pk, headers) for pk, _, headers in rows)]
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
        client = self.broker.client  # type: ignore[attr-defined]
        check_epoch(client)
        more = False
        windows = idempotent_windows(self.broker)
        queues: dict[str, set[str]] = {}
        for name in windows:
            queues.setdefault(self.broker.actors[name].queue_name, set()).add(name)
        check_counts(client, self.broker.namespace, queues,  # type: ignore[attr-defined]
                     once_per_s=self.interval_s)
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
