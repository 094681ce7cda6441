"""The outbox's statements as SQL text (run by ``composition.outbox.claims``, whose doc says
what each does and why its commit may skip the WAL flush)."""

from __future__ import annotations

__all__ = ["CLAIM_SQL", "CONFIRM_SQL", "INSERT_SQL", "INSERT_UNLESS_KEY_PENDING_SQL", "KEEP", "KEEP_CONDITION",
           "MARK_SENT_SQL", "MARK_SENT_UNKEYED_SQL", "MOVE_SQL", "RELAX", "RELAX_CONDITION", "RELEASE_SQL",
           "RENEW_SQL"]

# "{relax}" is what turns synchronous_commit off for a statement's own implicit transaction, or
# NULL inside a caller's transaction (whose commit it would cover); see the module doc.
# "{relax_condition}" does the same as a WHERE condition that always holds.
RELAX = "set_config('synchronous_commit', 'off', true)"
KEEP = "NULL"
RELAX_CONDITION = f"{RELAX} IS NOT NULL"
KEEP_CONDITION = "TRUE"

# Every publish runs one of these, and the statement is planned anew each time (client-side
# binding): the plain VALUES form plans in a few tens of microseconds; only a row with a key pays
# for the look at its key's other pending rows.
INSERT_SQL = """
INSERT INTO {table} (actor_name, queue_name, payload, key, headers, delay_s, status, created_at,
                     claimed_until, claimed_by, attempts, sent_at, last_error)
VALUES (%(actor_name)s, %(queue_name)s, %(payload)s::jsonb, %(key)s, %(headers)s::jsonb, %(delay_s)s,
        'pending', %(created_at)s,
        CASE WHEN %(claim)s THEN statement_timestamp() + make_interval(secs => %(lease_s)s) END,
        %(relay_id)s, CASE WHEN %(claim)s THEN 1 ELSE 0 END, NULL, '')
RETURNING id, claimed_until
"""

INSERT_UNLESS_KEY_PENDING_SQL = """
INSERT INTO {table} (actor_name, queue_name, payload, key, headers, delay_s, status, created_at,
                     claimed_until, claimed_by, attempts, sent_at, last_error)
SELECT %(actor_name)s, %(queue_name)s, %(payload)s::jsonb, %(key)s, %(headers)s::jsonb, %(delay_s)s,
       'pending', %(created_at)s,
       CASE WHEN f.free THEN statement_timestamp() + make_interval(secs => %(lease_s)s) END,
       CASE WHEN f.free THEN %(relay_id)s ELSE '' END,
       CASE WHEN f.free THEN 1 ELSE 0 END,
       NULL, ''
FROM (SELECT NOT EXISTS (
        SELECT 1 FROM {table} p
        WHERE p.status = 'pending' AND p.key = %(key)s AND p.id <> ALL(%(own_ids)s::bigint[])) AS free) f
RETURNING id, claimed_until
"""

CLAIM_SQL = """
WITH heads AS (
    SELECT o.id, o.key
    FROM {table} o
    WHERE o.status = 'pending'
      AND (o.claimed_until IS NULL OR o.claimed_until < now())
      AND (%(only_ids)s::bigint[] IS NULL OR o.id = ANY(%(only_ids)s::bigint[]))
      AND (o.key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {table} p
            WHERE p.status = 'pending' AND p.key = o.key AND p.id < o.id))
    ORDER BY o.id
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
), followers AS (
    SELECT o.id
    FROM {table} o JOIN heads h ON o.key = h.key
    WHERE o.status = 'pending' AND o.id > h.id
      AND (o.claimed_until IS NULL OR o.claimed_until < now())
      -- Not past a row of the key that is leased elsewhere (inserted leased by a transaction
      -- that committed late, say): the key's order would break at that row.
      AND NOT EXISTS (
            SELECT 1 FROM {table} p
            WHERE p.status = 'pending' AND p.key = o.key AND p.id > h.id AND p.id < o.id
              AND p.claimed_until >= now())
    ORDER BY o.id
    LIMIT %(limit)s
), picked AS (
    -- Cutting the union in id order keeps, for every key, a prefix of its pending rows.
    SELECT id FROM (SELECT id FROM heads UNION ALL SELECT id FROM followers) u
    ORDER BY id
    LIMIT %(limit)s
)
UPDATE {table} t
SET claimed_until = now() + make_interval(secs => %(lease_s)s),
    claimed_by = %(relay_id)s,
    attempts = t.attempts + 1
FROM picked, (SELECT {relax}) relax
WHERE t.id = picked.id AND t.status = 'pending'
RETURNING t.id, t.actor_name, t.queue_name, t.payload, t.key, t.headers, t.delay_s, t.created_at, t.due_at
"""

# After COMMIT, for rows ``insert`` leased to this relay: renew the lease of those it still holds
# and give back those that an older pending row of their key (one this insert could not see)
# now precedes; the rows of ``ids`` never block each other, they are one transaction's, in order.
CONFIRM_SQL = """
WITH own AS (
    SELECT o.id,
           o.key IS NOT NULL AND EXISTS (
               SELECT 1 FROM {table} p
               WHERE p.status = 'pending' AND p.key = o.key AND p.id < o.id
                 AND p.id <> ALL(%(ids)s::bigint[])) AS blocked
    FROM {table} o
    WHERE o.id = ANY(%(ids)s::bigint[]) AND o.status = 'pending' AND o.claimed_by = %(relay_id)s
)
UPDATE {table} t
SET claimed_until = CASE WHEN own.blocked THEN NULL ELSE now() + make_interval(secs => %(lease_s)s) END,
    attempts = CASE WHEN own.blocked THEN t.attempts - 1 ELSE t.attempts END
FROM own, (SELECT {relax}) relax
WHERE t.id = own.id AND t.status = 'pending' AND t.claimed_by = %(relay_id)s
RETURNING t.id, own.blocked
"""

# Only the claimant renews, marks or releases: a relay whose lease ran out and whose rows another
# relay claimed again leaves them to that relay (both sent them: at least once, never lost).
# A released row (claimed_until NULL, claimed_by still this relay's) is not renewed: a renewal
# racing the release of a failed batch must not lease the row again for a whole lease.
RENEW_SQL = """
UPDATE {table} t SET claimed_until = now() + make_interval(secs => %(lease_s)s)
FROM (SELECT {relax}) relax
WHERE t.id = ANY(%(ids)s::bigint[]) AND t.status = 'pending' AND t.claimed_by = %(relay_id)s
  AND t.claimed_until IS NOT NULL
RETURNING t.id
"""

# It also answers whether a pending row of a marked row's key waits behind it: that row's own
# send after COMMIT found the key's head still in flight and left it to the relay, whose claim
# may have come too early as well; whoever marks the head then wakes the relay for it.
MARK_SENT_SQL = """
WITH marked AS (
    UPDATE {table} t SET status = 'sent', sent_at = %(sent_at)s, claimed_until = NULL, last_error = ''
    FROM (SELECT {relax}) relax
    WHERE t.id = ANY(%(ids)s::bigint[]) AND t.status = 'pending' AND t.claimed_by = %(relay_id)s
    RETURNING t.id, t.key
)
SELECT EXISTS (
    SELECT 1 FROM marked m JOIN {table} p ON p.key = m.key
    WHERE p.status = 'pending' AND p.id > m.id AND p.id <> ALL(%(ids)s::bigint[]))
"""

# The same for rows without a key, which nothing can wait behind: one plain UPDATE, which
# PostgreSQL plans and runs in about half the time of the statement above (it is run after
# every publishing COMMIT).
MARK_SENT_UNKEYED_SQL = """
UPDATE {table} t SET status = 'sent', sent_at = %(sent_at)s, claimed_until = NULL, last_error = ''
WHERE t.id = ANY(%(ids)s::bigint[]) AND t.status = 'pending' AND t.claimed_by = %(relay_id)s
  AND {relax_condition}
"""

RELEASE_SQL = """
UPDATE {table} t SET claimed_until = NULL, last_error = %(error)s
FROM (SELECT {relax}) relax
WHERE t.id = ANY(%(ids)s::bigint[]) AND t.status = 'pending' AND t.claimed_by = %(relay_id)s
"""

MOVE_SQL = """
UPDATE {table} t SET queue_name = %(queue_name)s
FROM (SELECT {relax}) relax
WHERE t.id = ANY(%(ids)s::bigint[]) AND t.status = 'pending' AND t.claimed_by = %(relay_id)s
"""
