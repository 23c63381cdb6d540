//! Durable calls on PostgreSQL (issue 62): a call written in the caller's
//! own transaction, so that it exists exactly when the business change
//! committed, then driven by the engine in any number of worker processes
//! until it is done or dead, through their crashes and the database's.
//!
//! ```no_run
//! use std::time::Duration;
//! use retries::Policy;
//! use retries_sqlx::durable::{self, Enqueue, Handler, Worker};
//!
//! # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! durable::migrate(&pool).await?;
//! // In the business transaction: the order and its charge, together.
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
//! durable::enqueue(&mut tx, Enqueue::json("charge", &serde_json::json!({"order": 42, "cents": 500}))?).await?;
//! tx.commit().await?;
//!
//! // In any number of worker processes:
//! const POLICY: Policy = Policy::new(Duration::from_secs(10)).validated();
//! Worker::new(pool)
//!     .handle("charge", Handler::not_idempotent(POLICY, async |call, at| {
//!         let order: serde_json::Value = call.json()?;
//!         // Send `at.idempotency_key()` (the call's own key, the same on
//!         // every attempt and after every crash) with the charge.
//!         Ok::<(), retries_sqlx::durable::HandlerError>(())
//!     }).reconcile(async |call| {
//!         // Did the charge of `call.key()` happen? Asked before anything
//!         // is sent again after a crash or an unknown outcome.
//!         Ok::<bool, retries_sqlx::durable::HandlerError>(false)
//!     }))
//!     .run(std::future::pending())
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # The life of a call
//!
//! * **Enqueued** with the caller's transaction ([`enqueue`]): its name,
//!   its payload (bytes, or JSON with [`Enqueue::json`]), its idempotency
//!   key (random unless given), its time to live (the deadline of the
//!   whole call, counted from the enqueue: one hour unless given) and a
//!   delay. One call per key: enqueuing a key that has a call (ready, done
//!   or dead) adds nothing and says so.
//! * **Claimed** by a worker that knows its name, once due (`FOR UPDATE
//!   SKIP LOCKED`): the claim gives it a lease (10 s unless set, renewed
//!   every third of it while the call runs) and a new lease number, which
//!   fences every write after it: a worker whose lease lapsed and was
//!   taken over writes nothing more, and stops the call at its next write.
//! * **Run by the engine**, the same loop as every door's: the handler's
//!   [`Policy`](retries_core::Policy) (its deadline bounds one claim's loop, and the call's own
//!   deadline bounds it too), verdicts, `reconcile`, a budget and a breaker
//!   per name, the attempt's context carrying the stored key. Before each
//!   attempt is sent, the call is marked *started* (in its own statement,
//!   not in the handler's transaction); a failure the handler's error says
//!   did not run clears the mark; each pause of the engine is written as
//!   the call's due time.
//! * **Ended**: done on success; dead with its reason and last error on a
//!   permanent failure, an unknown outcome nothing resolved, a payload the
//!   handler cannot decode ([`Call::json`] fails as permanent), a handler
//!   that panicked (an unknown outcome: its `reconcile` first, as for any
//!   other) or a spent deadline. A claim's loop that ends with the call's
//!   deadline still ahead (the policy's attempts or deadline spent) puts
//!   it back in the queue, due after a delay that doubles with each such
//!   claim (1 s, 2 s … at most 5 min); a call the breaker, the budget or a
//!   rate limit held back goes back due in a second, nothing sent.
//!
//! # A crash is an unknown outcome
//!
//! A worker that dies mid-attempt leaves its call marked started, its
//! lease running out. The next worker to claim it (after the lease) does
//! not send it blindly: for a non-idempotent handler the first thing the
//! engine does is ask its `reconcile`, and only "not done" sends it again
//! (without `reconcile`, the call is dead, `unknown_outcome`); an
//! idempotent handler's call is sent again with the same key. No other
//! path sends a started call: the sweeper only kills calls past their
//! deadline, and [`redrive`] marks what it revives as started.
//!
//! Chosen where the issue was silent, and said here:
//!
//! * **A name no worker knows** is never claimed (a worker claims only its
//!   own names): it waits for a worker that knows it, until its deadline,
//!   when any worker's sweep makes it dead, `deadline_exceeded`. A
//!   rolling deploy that adds a handler loses nothing.
//! * **The dead stay in the table** (`state = 'dead'`, with `reason` and
//!   `last_error`), shown by the view `retries_dead_calls`: a key stays
//!   one call whatever became of it, with no second table to race. Done
//!   calls stay until [`prune`] deletes them (their keys are then free).
//! * **A call's loop stays in the worker that claimed it**, pauses
//!   included, while its lease is renewed: a short pause is not a round
//!   trip through the queue. Each pause is written as the due time, so
//!   that a crash resumes the call no sooner than the engine would have.
//!
//! # Throughput
//!
//! Each attempt's mark and each call's end are written in batches (the
//! writes queued while one batch is in flight go in the next, one
//! statement each), and claims are made for half the worker's room or
//! more: 10,000 no-op calls, 32 at once over 8 connections, run at 1.4×
//! the throughput of a hand-written `SKIP LOCKED` loop that claims a batch
//! and marks each job done (`cargo bench -p retries-postgres-tests --bench
//! durable`; `tests/bench/README.md`). The claim reads the due calls by
//! the index on `due_at` only once the table has statistics: a queue
//! filled in one burst is sorted whole at each claim until autovacuum
//! analyses it, so [`migrate`] sets the table's autovacuum thresholds to
//! 2 % (run `ANALYZE retries_calls` after a bulk load to skip the wait).
//!
//! # Seen
//!
//! Counters `retry.durable.enqueued`, `.done`, `.retried` (a pause, or a
//! call put back), `.dead` by `name` (and `reason` for the dead), the
//! histogram `retry.durable.oldest_due_age` by `name` (seconds: at each
//! claim, how long the oldest call of that name it took had been due; a
//! queue no worker claims from records nothing, so alert on [`stats`]'
//! `oldest_due` too), one
//! WARN per dead call (target `retries::door`, door `durable`), and
//! [`stats`] for the same per name from the table. Each claim of a call
//! runs in a DEBUG span `durable call` (target `retries_sqlx::durable`,
//! fields `name`, `key`, `earlier_attempts` and `enqueued_trace`, the
//! [`Enqueue::trace`] given at enqueue), in which the engine's attempt
//! spans nest: every attempt of a call, in any worker, carries the
//! enqueuing transaction's `traceparent`. With the feature
//! `opentelemetry-0.33` and a `tracing-opentelemetry` 0.34 layer, that span
//! also carries an OpenTelemetry *link* to the enqueuing trace (a link, not
//! the parent, as OpenTelemetry's messaging conventions do for a consumer:
//! a call may run hours later, in another process, once per claim); each
//! claim is the root of a trace of its own. A `traceparent` that is not
//! W3C trace context level 1 is kept as the field and linked to nothing.
//! [`Call::trace`] gives it to a handler that propagates it itself.

mod call;
mod link;
mod sql;
mod worker;
mod writes;

pub use call::{Call, HandlerError};
pub use worker::{Handler, Worker, WorkerError};

use std::time::Duration;

use retries_core::IdempotencyKey;
use sqlx_core::executor::Executor;
use sqlx_postgres::{PgConnection, PgPool, Postgres};

/// The time to live of a call enqueued without one: an hour.
pub const DEFAULT_TTL: Duration = Duration::from_hours(1);

/// A call to enqueue (see [`enqueue`]).
#[derive(Debug, Clone)]
pub struct Enqueue {
    name: String,
    payload: Vec<u8>,
    key: Option<IdempotencyKey>,
    ttl: Duration,
    delay: Duration,
    trace: Option<String>,
}

/// A payload that is not JSON-serialisable.
#[derive(Debug, thiserror::Error)]
#[error("the payload could not be written as JSON: {0}")]
pub struct PayloadError(#[from] serde_json::Error);

impl Enqueue {
    /// A call of handler `name` with `payload` as bytes.
    pub fn new(name: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            name: name.into(),
            payload: payload.into(),
            key: None,
            ttl: DEFAULT_TTL,
            delay: Duration::ZERO,
            trace: None,
        }
    }

    /// A call of handler `name` with `payload` written as JSON (read back
    /// with [`Call::json`]).
    ///
    /// # Errors
    ///
    /// When `payload` cannot be written as JSON (a map with non-string
    /// keys, a failing `Serialize`).
    pub fn json<T: serde::Serialize + ?Sized>(
        name: impl Into<String>,
        payload: &T,
    ) -> Result<Self, PayloadError> {
        Ok(Self::new(name, serde_json::to_vec(payload)?))
    }

    /// The call's idempotency key (a random one otherwise): the key every
    /// attempt carries, and the call's identity: one call per key.
    #[must_use]
    pub fn key(mut self, key: IdempotencyKey) -> Self {
        self.key = Some(key);
        self
    }

    /// The deadline of the whole call, counted from the enqueue (an hour
    /// otherwise): no attempt starts after it, and a call not done by then
    /// is dead.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Not due before `delay` from the enqueue.
    #[must_use]
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The enqueuing transaction's trace (a W3C `traceparent`), handed to
    /// every attempt's handler ([`Call::trace`]) to link its spans.
    #[must_use]
    pub fn trace(mut self, traceparent: impl Into<String>) -> Self {
        self.trace = Some(traceparent.into());
        self
    }
}

/// What [`enqueue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The call's key.
    pub key: IdempotencyKey,
    /// `false` when the key already had a call: nothing was added.
    pub added: bool,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Write the durable call `call` with `conn`: the caller's transaction
/// (`&mut tx`, a `sqlx::Transaction`'s connection), so that the call
/// exists exactly when the transaction commits. One call per key.
///
/// # Errors
///
/// The database's error; the caller's transaction is then to be rolled
/// back as for any failed statement.
pub async fn enqueue(conn: &mut PgConnection, call: Enqueue) -> Result<Enqueued, sqlx_core::Error> {
    let key = call.key.unwrap_or_else(IdempotencyKey::random);
    let added: Option<(i64,)> = sqlx_core::query_as::query_as(sql::ENQUEUE)
        .bind(&call.name)
        .bind(key.to_string())
        .bind(&call.payload)
        .bind(millis(call.ttl))
        .bind(millis(call.delay))
        .bind(&call.trace)
        .fetch_optional(&mut *conn)
        .await?;
    if added.is_some() && retries_core::door::observe::METRICS {
        worker::count("retry.durable.enqueued", worker::label(&call.name), None);
    }
    Ok(Enqueued {
        key,
        added: added.is_some(),
    })
}

/// Make the table `retries_calls` and the view `retries_dead_calls` if
/// they do not exist (safe to run from every worker at once).
///
/// # Errors
///
/// The database's error.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx_core::Error> {
    let mut tx = sqlx_core::pool::Pool::<Postgres>::begin(pool).await?;
    (&mut *tx).execute(sql::MIGRATE).await?;
    tx.commit().await
}

/// Send dead calls again, `per_second` at most (the operator's rate), of
/// the handlers `names` (all when empty), each with its original key, a
/// new deadline of `ttl` from now, and marked started: a non-idempotent
/// handler's `reconcile` runs before anything is sent. Returns how many
/// were revived; stops when none is left.
///
/// # Errors
///
/// The database's error (what was revived before it stays revived).
pub async fn redrive(
    pool: &PgPool,
    names: &[&str],
    per_second: u32,
    ttl: Duration,
) -> Result<u64, sqlx_core::Error> {
    let per_second = per_second.max(1);
    // Batches of a tenth of a second's worth (at least one).
    let batch = (per_second / 10).max(1);
    let every = Duration::from_secs(1) * batch / per_second;
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut revived = 0;
    loop {
        let started = tokio::time::Instant::now();
        let n = sqlx_core::query::query(sql::REDRIVE)
            .bind(&names)
            .bind(i64::from(batch))
            .bind(millis(ttl))
            .execute(pool)
            .await?
            .rows_affected();
        revived += n;
        if n < u64::from(batch) {
            return Ok(revived);
        }
        tokio::time::sleep_until(started + every).await;
    }
}

/// One handler's calls in the table (see [`stats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NameStats {
    /// The handler's name.
    pub name: String,
    /// Calls waiting or running.
    pub ready: u64,
    /// Calls done (until pruned).
    pub done: u64,
    /// Calls dead.
    pub dead: u64,
    /// How long the oldest due call has been due (zero: none is).
    pub oldest_due: Duration,
}

/// The calls in the table, per handler name.
///
/// # Errors
///
/// The database's error.
pub async fn stats(pool: &PgPool) -> Result<Vec<NameStats>, sqlx_core::Error> {
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx_core::query_as::query_as(sql::STATS)
        .fetch_all(pool)
        .await?;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(rows
        .into_iter()
        .map(|(name, ready, done, dead, oldest)| NameStats {
            name,
            ready: n(ready),
            done: n(done),
            dead: n(dead),
            oldest_due: Duration::from_millis(n(oldest)),
        })
        .collect())
}

/// Delete the done calls that ended more than `older_than` ago (their keys
/// can be enqueued again after it). Returns how many.
///
/// # Errors
///
/// The database's error.
pub async fn prune(pool: &PgPool, older_than: Duration) -> Result<u64, sqlx_core::Error> {
    Ok(sqlx_core::query::query(sql::PRUNE)
        .bind(millis(older_than))
        .execute(pool)
        .await?
        .rows_affected())
}
