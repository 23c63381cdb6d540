//! The durable calls' SQL, in one place: the table, and every statement
//! the enqueuing side, the workers and an operator send.

/// The table and its view of the dead, made once under an advisory lock
/// (workers that start together would otherwise race on the catalog).
pub(super) const MIGRATE: &str = "
SELECT pg_advisory_xact_lock(7306981237561298);
CREATE TABLE IF NOT EXISTS retries_calls (
    id bigserial PRIMARY KEY,
    name text NOT NULL,
    key text NOT NULL UNIQUE,
    payload bytea NOT NULL,
    state text NOT NULL DEFAULT 'ready' CHECK (state IN ('ready', 'done', 'dead')),
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    deadline timestamptz NOT NULL,
    due_at timestamptz NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    started boolean NOT NULL DEFAULT false,
    lease bigint NOT NULL DEFAULT 0,
    lease_until timestamptz,
    owner text,
    reason text,
    last_error text,
    finished_at timestamptz,
    trace text
);
CREATE INDEX IF NOT EXISTS retries_calls_due ON retries_calls (due_at) WHERE state = 'ready';
ALTER TABLE retries_calls SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
CREATE OR REPLACE VIEW retries_dead_calls AS
    SELECT id, name, key, payload, enqueued_at, deadline, attempts, started, reason, last_error, finished_at, trace
    FROM retries_calls WHERE state = 'dead';
";

/// `$1` name, `$2` key, `$3` payload, `$4` time to live (ms), `$5` delay
/// (ms), `$6` trace. The key's call if one exists (any state): one call per
/// key.
pub(super) const ENQUEUE: &str = "
INSERT INTO retries_calls (name, key, payload, deadline, due_at, trace)
VALUES ($1, $2, $3,
        clock_timestamp() + $4 * interval '1 millisecond',
        clock_timestamp() + $5 * interval '1 millisecond', $6)
ON CONFLICT (key) DO NOTHING
RETURNING id";

/// `$1` the names this worker knows, `$2` its owner name, `$3` the lease
/// (ms), `$4` how many. Due calls whose lease (if any) has lapsed, oldest
/// due first, each claimed with a new lease number (the fence of every
/// write after).
pub(super) const CLAIM: &str = "
UPDATE retries_calls c
SET lease = c.lease + 1,
    lease_until = clock_timestamp() + $3 * interval '1 millisecond',
    owner = $2
FROM (
    SELECT id FROM retries_calls
    WHERE state = 'ready' AND due_at <= clock_timestamp() AND deadline > clock_timestamp()
      AND name = ANY($1)
      AND (lease_until IS NULL OR lease_until < clock_timestamp())
    ORDER BY due_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED
) d
WHERE c.id = d.id
RETURNING c.id, c.name, c.key, c.payload, c.lease, c.attempts, c.started,
    GREATEST(0, FLOOR(EXTRACT(EPOCH FROM (c.deadline - clock_timestamp())) * 1000))::bigint,
    GREATEST(0, FLOOR(EXTRACT(EPOCH FROM (clock_timestamp() - c.due_at)) * 1000))::bigint,
    c.trace";

/// `$1` id, `$2` lease, `$3` lease (ms): the lease renewed, if still ours.
pub(super) const RENEW: &str = "
UPDATE retries_calls SET lease_until = clock_timestamp() + $3 * interval '1 millisecond'
WHERE id = $1 AND lease = $2 AND state = 'ready'";

/// `$1` id, `$2` lease, `$3` error: the attempt failed and did not run
/// (or failed for good): nothing is left to resolve.
pub(super) const NOT_RUN: &str = "
UPDATE retries_calls SET started = false, last_error = $3
WHERE id = $1 AND lease = $2 AND state = 'ready'";

/// `$1` id, `$2` lease, `$3` attempts then, `$4` pause (ms), `$5` error:
/// the engine's pause before the next attempt, written as the call's due
/// time (a crash in the pause resumes it then, not sooner).
pub(super) const PAUSE: &str = "
UPDATE retries_calls SET due_at = clock_timestamp() + $4 * interval '1 millisecond', last_error = $5
WHERE id = $1 AND lease = $2 AND attempts = $3 AND state = 'ready'";

/// `$1` id, `$2` lease, `$3` reason, `$4` error: dead.
pub(super) const DEAD: &str = "
UPDATE retries_calls SET state = 'dead', lease_until = NULL, reason = $3,
    last_error = COALESCE($4, last_error), finished_at = clock_timestamp()
WHERE id = $1 AND lease = $2 AND state = 'ready'";

/// `$1` id, `$2` lease, `$3` delay (ms), `$4` error: back to the queue,
/// due after the delay, the lease let go.
pub(super) const LATER: &str = "
UPDATE retries_calls SET due_at = clock_timestamp() + $3 * interval '1 millisecond',
    lease_until = NULL, last_error = COALESCE($4, last_error)
WHERE id = $1 AND lease = $2 AND state = 'ready'";

/// Calls past their deadline that no worker holds: dead, `unknown_outcome`
/// when an attempt had started, else `deadline_exceeded`.
pub(super) const SWEEP: &str = "
UPDATE retries_calls
SET state = 'dead', finished_at = clock_timestamp(), lease_until = NULL,
    reason = CASE WHEN started THEN 'unknown_outcome' ELSE 'deadline_exceeded' END,
    last_error = COALESCE(last_error, 'no attempt before the deadline (no worker took it)')
WHERE id IN (
    SELECT id FROM retries_calls
    WHERE state = 'ready' AND deadline <= clock_timestamp()
      AND (lease_until IS NULL OR lease_until < clock_timestamp())
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
)
RETURNING name, key, reason";

/// `$1` names (empty: all), `$2` how many, `$3` time to live (ms): dead
/// calls sent again, each with its key, marked started so that a
/// non-idempotent handler's `reconcile` runs first.
pub(super) const REDRIVE: &str = "
UPDATE retries_calls
SET state = 'ready', started = true, due_at = clock_timestamp(),
    deadline = clock_timestamp() + $3 * interval '1 millisecond',
    reason = NULL, finished_at = NULL, lease_until = NULL
WHERE id IN (
    SELECT id FROM retries_calls
    WHERE state = 'dead' AND (cardinality($1::text[]) = 0 OR name = ANY($1))
    ORDER BY id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)";

/// Per name: calls ready, done, dead, and the age of the oldest due one
/// (ms).
pub(super) const STATS: &str = "
SELECT name,
    COUNT(*) FILTER (WHERE state = 'ready'),
    COUNT(*) FILTER (WHERE state = 'done'),
    COUNT(*) FILTER (WHERE state = 'dead'),
    COALESCE(FLOOR(EXTRACT(EPOCH FROM (clock_timestamp()
        - MIN(due_at) FILTER (WHERE state = 'ready' AND due_at <= clock_timestamp()))) * 1000), 0)::bigint
FROM retries_calls GROUP BY name ORDER BY name";

/// `$1` age (ms): done calls older than it deleted (their keys then free).
pub(super) const PRUNE: &str = "
DELETE FROM retries_calls
WHERE state = 'done' AND finished_at < clock_timestamp() - $1 * interval '1 millisecond'";

/// `$1` ids, `$2` their leases: attempts start (each written before it is
/// sent), the ids written returned.
pub(super) const START_MANY: &str = "
UPDATE retries_calls c SET started = true, attempts = c.attempts + 1
FROM unnest($1::bigint[], $2::bigint[]) AS w(id, lease)
WHERE c.id = w.id AND c.lease = w.lease AND c.state = 'ready'
RETURNING c.id";

/// `$1` ids, `$2` their leases: done, the ids written returned.
pub(super) const DONE_MANY: &str = "
UPDATE retries_calls c SET state = 'done', started = false, lease_until = NULL, finished_at = clock_timestamp()
FROM unnest($1::bigint[], $2::bigint[]) AS w(id, lease)
WHERE c.id = w.id AND c.lease = w.lease AND c.state = 'ready'
RETURNING c.id";
