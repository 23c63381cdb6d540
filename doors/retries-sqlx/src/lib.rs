//! Database transactions on PostgreSQL through `sqlx`, driven by the
//! `retries` engine (on its public seam, [`retries::door`](retries_core::door)):
//! [`Transactions::transaction`] reruns the *whole* transaction
//! when PostgreSQL rolled it back, and resolves a `COMMIT` whose reply was
//! lost instead of guessing.
//!
//! ```no_run
//! use std::time::Duration;
//! use retries::{Attempt, Policy};
//! use retries_sqlx::{Transaction, Transactions, Tx};
//!
//! const POLICY: Policy = Policy::new(Duration::from_secs(5)).with_max_attempts(5).validated();
//!
//! async fn transfer(pool: &sqlx::PgPool, from: i64, to: i64, cents: i64) -> Result<(), retries_sqlx::Error> {
//!     retries::call(&POLICY)
//!         .transaction_fn(Transaction::on(pool).serializable(), |tx: &mut Tx, _: &Attempt| {
//!             Box::pin(async move {
//!                 // Everything that decides which SQL to issue runs again on a rerun.
//!                 sqlx::query("UPDATE accounts SET balance = balance - $2 WHERE id = $1")
//!                     .bind(from).bind(cents).execute(&mut *tx).await?;
//!                 sqlx::query("UPDATE accounts SET balance = balance + $2 WHERE id = $1")
//!                     .bind(to).bind(cents).execute(&mut *tx).await?;
//!                 Ok(())
//!             })
//!         })
//!         .await
//! }
//!
//! // Where services live: in a spawned task, as an axum handler's future is.
//! // (`transaction_fn`'s future is `Send`; an `async` closure's, capturing
//! // locals, currently is not: rust-lang/rust#138207.)
//! fn spawn_transfer(pool: sqlx::PgPool) -> tokio::task::JoinHandle<Result<(), retries_sqlx::Error>> {
//!     tokio::spawn(async move { transfer(&pool, 1, 2, 500).await })
//! }
//! ```
//!
//! # One attempt
//!
//! 1. A connection from the pool, `BEGIN` (with the isolation level asked
//!    for), `SET LOCAL statement_timeout` to the attempt's remaining time
//!    and `SET LOCAL idle_in_transaction_session_timeout` to the call's, in
//!    one round trip: no statement outlives the attempt on the server, and
//!    no transaction left idle by a client that stalled outlives the call
//!    (the server ends its session and releases its locks).
//! 2. The closure, with a [`Tx`]: every statement goes through it, so the
//!    door sees every error the database returns.
//! 3. Its id (`pg_current_xact_id_if_assigned()`, `NULL` for a
//!    transaction that wrote nothing) with the server's life (see
//!    [after a crash](#after-a-crash-or-a-failover)), then `COMMIT`. The id
//!    costs a round trip, the door's only one beyond a hand-written
//!    transaction's: it must be known before `COMMIT` is sent, since the
//!    `COMMIT`'s reply is what may be lost. It is skipped for a `READ ONLY`
//!    transaction ([`Transaction::read_only`]) and when the builder has a
//!    `reconcile`, which looks by the call's key instead.
//! 4. `COMMIT` is sent only with at least 25 ms left before the call's
//!    deadline (closer to it the transaction is rolled back: not executed),
//!    and its reply is awaited until 15 ms before the deadline, which leaves
//!    one look-up its room.
//!
//! # Verdicts, by SQLSTATE and phase
//!
//! PostgreSQL aborts a transaction at its first error, and a transaction whose
//! `COMMIT` was never sent never commits. So everything before `COMMIT` is
//! **not executed**, and the whole closure may run again even when its writes
//! are not idempotent; a connection lost *during* `COMMIT` leaves the outcome
//! **unknown**.
//!
//! | error | before `COMMIT` | during `COMMIT` | autocommit ([`Classify`](retries_core::Classify) for `sqlx::Error`) |
//! |---|---|---|---|
//! | `40001` serialization failure, `40P01` deadlock | not executed | not executed | not executed |
//! | `40003` statement completion unknown (CockroachDB) | unknown | unknown | unknown |
//! | class `08` connection errors, `57P01`/`57P02` shutdown, I/O errors, protocol errors, a crashed worker | not executed | unknown | unknown |
//! | `08001`, `08004`, `57P03` cannot connect now, `53300` too many connections, refused connections, `PoolTimedOut` | not executed | not executed | not executed |
//! | `23505` unique violation, `23P01` exclusion violation | permanent (not executed with [`Transaction::retry_unique_violation`]) | the same | the same |
//! | other constraint violations (class `23`), every other error | permanent | permanent | permanent |
//! | the call's deadline (or the attempt's `attempt_timeout`) cuts the attempt | not executed | unknown | — |
//!
//! **Under contention**, `40001` and `40P01` are the expected cost of
//! `SERIALIZABLE` (and of hot rows at any level), not a failing server: they
//! are conflicts ([`Verdict::with_conflict`](retries_core::Verdict::with_conflict)),
//! which draw nothing from the retry budget, are not counted by a breaker,
//! and are rerun up to 10 attempts in all when the policy allows fewer
//! (still within the deadline). 16 workers moving 400 units between two hot
//! rows at `SERIALIZABLE` with the defaults and a 10 s deadline: at least
//! 388 succeed (a test against PostgreSQL). A stop by the budget (for other
//! failures) reaches a [`transaction`](Transactions::transaction) caller as
//! a [`Stopped`] whose source is the last database error, never as that
//! error alone.
//!
//! `57014` (a statement cancelled, by the attempt's own `statement_timeout`
//! among others) is not executed before `COMMIT`: it aborted the transaction.
//! An error the closure returns that did not come from the database (its own
//! check, a decode error, `RowNotFound`) is classified by the call's
//! classifier ([`Classify`](retries_core::Classify) of the closure's error, or
//! [`Retry::classify`](retries_core::Retry::classify)).
//!
//! # The two traps
//!
//! * **A swallowed failure.** A statement fails with `40001`, the closure
//!   catches the error and returns `Ok`. PostgreSQL would answer the `COMMIT`
//!   of that aborted transaction with `ROLLBACK`, not an error, and a naive
//!   loop reports success for work that was rolled back. Here any database
//!   error seen by the [`Tx`] taints the attempt: the door sends no `COMMIT`,
//!   and the attempt fails with the error that aborted it (reported as a
//!   `sqlx::Error::Database` with the same SQLSTATE), so a `40001` reruns.
//! * **The lost `COMMIT` reply.** The connection breaks after `COMMIT` was
//!   sent. The door looks the transaction id up with
//!   `pg_xact_status` on another connection of the pool: `committed` → the
//!   call succeeds with the value the closure returned (no rerun);
//!   `aborted` (or an id not handed out yet) → rerun (it was not executed);
//!   `in progress` → it looks again every 20 ms, and just before the deadline
//!   (5 ms) the call stops with
//!   [`Reason::UnknownOutcome`](retries_core::Reason::UnknownOutcome) and a
//!   `40003` error that names the transaction. An attempt cut off by its
//!   `attempt_timeout` or by the call's deadline is resolved the same way
//!   (before `COMMIT`, it was not executed); the deadline never turns a sent
//!   `COMMIT` into [`Reason::DeadlineExceeded`](retries_core::Reason::DeadlineExceeded),
//!   which would tell the caller that nothing happened. A `reconcile` given
//!   to the builder replaces the look-up (by the call's idempotency key, a
//!   unique `external_id` column, say); it is consulted only when `COMMIT`
//!   was sent.
//!
//! An unknown outcome reaches a [`transaction`](Transactions::transaction)
//! caller as the look-up's error: a `sqlx::Error::Database` with SQLSTATE
//! `40003` (`transaction_resolution_unknown`) whose message names the
//! transaction and says what the look-up saw (or the builder's `reconcile`
//! error); [`transaction_outcome`](Transactions::transaction_outcome) gives
//! it as [`Failure::reconcile_error`].
//!
//! # After a crash or a failover
//!
//! A committed transaction's id is durable and never handed out again. An id
//! whose records had not reached the disk when the server crashed *is*
//! handed out again after crash recovery, to whichever transaction starts
//! next — also after one backend's crash or OOM kill (the postmaster then
//! restarts every backend the same way), after a failover to a standby that
//! had not received the commit, and after a restore. So `committed` can be
//! another transaction's commit under the lost one's id.
//!
//! The door reads, with the id and in the same round trip, the server's
//! life: the postmaster's start time, the time its shared statistics were
//! last reset (crash recovery resets them), and the WAL timeline (a promoted
//! standby starts a new one). The look-up reads them again:
//!
//! * **the same life**: `committed` is this transaction's commit, and the
//!   call succeeds with the closure's value; `aborted` reruns it;
//! * **another life**: `aborted`, `in progress` (looked at again) and an id
//!   not handed out yet all mean the transaction did not commit (had it
//!   committed, its id would still be its own), so it reruns; `committed`
//!   is ambiguous, and the call stops with the outcome unknown (`40003`,
//!   "the server restarted or failed over since the id was read"), never
//!   `Ok`.
//!
//! **When the look-up suffices, and when to give a `reconcile`.** Without a
//! crash or a failover between the `COMMIT` and the look-up (a connection
//! reset, a proxy or load balancer that dropped the reply, a timeout), the
//! look-up answers exactly and costs nothing to write. After one, a
//! transaction whose `COMMIT` was in flight ends unknown when its id is taken
//! again — with a synchronous standby too, whose copy of the commit may or may
//! not exist, and with an asynchronous one, which may have lost it. Where
//! that must resolve as well (payments, anything a caller cannot check by
//! hand), write a row under the call's idempotency key
//! ([`Attempt::idempotency_key`](retries_core::Attempt::idempotency_key)) in
//! the transaction, with a unique constraint, and give the builder a
//! `reconcile` that looks it up: that row commits or vanishes with the
//! transaction, on every server, so it answers after any crash or failover.
//! A manual `pg_stat_reset_shared('bgwriter')` also counts as a new life: it
//! only makes the door answer "unknown" where it could have answered
//! `committed`.
//!
//! # What stays yours
//!
//! The closure runs again, whole, on every rerun: effects outside the
//! database inside it (an e-mail, an HTTP call) repeat with it. Do them after
//! the call returns, or make them idempotent by the attempt's
//! [`idempotency_key`](retries_core::Attempt::idempotency_key). A statement sent
//! around the [`Tx`] (on another connection) is not part of the transaction.
//! The look-up needs PostgreSQL 13 or later (`pg_xact_status`), and a value
//! the closure returns is kept until the outcome is known. A server run
//! with `synchronous_commit = off` answers `COMMIT` before the commit is
//! durable: a crash can then lose a commit the door (like any client) was
//! told succeeded.
//!
//! A stop of the library's own (the deadline, an open breaker) reaches a
//! closure whose error type is `sqlx::Error` as a `sqlx::Error::Database`
//! carrying the [`Stopped`] (the one variant of `sqlx::Error` that can carry a
//! typed error): `sqlx` prints it after "error returned from database:",
//! although no database returned it. Give the closure the error type
//! [`Error`] (or one of your own with a `From<Stopped>`): a stop is then
//! [`Error::Stopped`] and reads as one. With `sqlx::Error`, match it with
//! `err.as_database_error().and_then(|e| e.try_downcast_ref::<Stopped>())`.

mod keys;

pub use keys::{KeyError, PgKeyStore};

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_core::future::BoxFuture;
use futures_core::stream::BoxStream;
use futures_util::{FutureExt as _, TryFutureExt as _, TryStreamExt as _};
use sqlx_core::Either;
use sqlx_core::error::{DatabaseError, Error as SqlxError, ErrorKind};
use sqlx_core::executor::{Execute, Executor};
use sqlx_core::sql_str::{AssertSqlSafe, SqlStr};
use sqlx_postgres::{PgPool, PgQueryResult, PgRow, PgStatement, PgTypeInfo, Postgres};

use retries_core::Retry;
use retries_core::attempt::{Attempt, IdempotencyKey};
use retries_core::breaker::Breaker;
use retries_core::budget::Budget;
use retries_core::door::Parts;
use retries_core::failure::{Failure, Stopped};
use retries_core::slots::{
    Classifier, ClassifyWith, LimitSlot, NoRetryIf, NotIdempotent, OnRetry, ReconcileWith,
    Reconciler, Undeclared,
};
use retries_core::sqlx::{Phase, verdict};
use retries_core::verdict::Verdict;

/// An error the door reports itself, as a `sqlx::Error::Database` so that
/// it travels through the closure's own error type: the replay of an error
/// the closure swallowed (with its SQLSTATE), or a `COMMIT` whose outcome
/// stayed unknown (`40003`).
#[derive(Debug)]
pub struct DoorError {
    code: Cow<'static, str>,
    message: String,
}

impl DoorError {
    fn sqlx(code: impl Into<Cow<'static, str>>, message: String) -> SqlxError {
        SqlxError::Database(Box::new(Self {
            code: code.into(),
            message,
        }))
    }
}

impl fmt::Display for DoorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DoorError {}

impl DatabaseError for DoorError {
    fn message(&self) -> &str {
        &self.message
    }
    fn code(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.code))
    }
    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }
    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }
    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }
    fn kind(&self) -> ErrorKind {
        match &*self.code {
            "23505" => ErrorKind::UniqueViolation,
            "23503" => ErrorKind::ForeignKeyViolation,
            "23502" => ErrorKind::NotNullViolation,
            "23514" => ErrorKind::CheckViolation,
            "23P01" => ErrorKind::ExclusionViolation,
            _ => ErrorKind::Other,
        }
    }
}

/// An error type for a transaction's closure that keeps the library's stops
/// apart from the database's errors: with it, a stop reads as what it is
/// (`retry stopped: deadline exceeded after 2 attempts …`), where a
/// `sqlx::Error` can carry it only as a `Database` error, which `sqlx`
/// prints after "error returned from database:". An unknown outcome is the
/// look-up's SQLSTATE `40003` error, naming the transaction.
///
/// ```no_run
/// # use std::time::Duration;
/// # use retries::{Attempt, Policy};
/// # use retries_sqlx::{Transactions, Tx};
/// # async fn f(pool: &sqlx::PgPool) {
/// # const POLICY: Policy = Policy::new(Duration::from_secs(5)).validated();
/// let done = retries::call(&POLICY)
///     .transaction(pool, async |tx: &mut Tx, _: &Attempt| -> Result<(), retries_sqlx::Error> {
///         sqlx::query("UPDATE t SET n = n + 1").execute(&mut *tx).await?;
///         Ok(())
///     })
///     .await;
/// match done {
///     Ok(()) => {}
///     Err(retries_sqlx::Error::Stopped(stop)) => eprintln!("gave up: {stop}"),
///     Err(e) => eprintln!("the database said: {e}"),
/// }
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An error of the database or the connection, as `sqlx` reports it.
    Database(SqlxError),
    /// The call stopped (its deadline, an open breaker, its budget); the
    /// last database error, if any, is its source.
    Stopped(Stopped),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Database(e) => e.fmt(f),
            Self::Stopped(s) => s.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Database(e) => e.source(),
            Self::Stopped(s) => s.source(),
        }
    }
}

impl From<SqlxError> for Error {
    fn from(e: SqlxError) -> Self {
        Self::Database(e)
    }
}

impl From<Stopped> for Error {
    fn from(s: Stopped) -> Self {
        Self::Stopped(s)
    }
}

impl retries_core::Classify for Error {
    fn classify(&self) -> Verdict {
        match self {
            Self::Database(e) => e.classify(),
            Self::Stopped(s) => s.classify(),
        }
    }
}

/// The isolation level of each attempt's `BEGIN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// The server's default (`default_transaction_isolation`, normally
    /// `READ COMMITTED`): a plain `BEGIN`.
    Default,
    /// `READ COMMITTED`.
    ReadCommitted,
    /// `REPEATABLE READ`: may fail with `40001`, which is rerun.
    RepeatableRead,
    /// `SERIALIZABLE`: may fail with `40001`, which is rerun.
    Serializable,
}

/// Where and how each attempt's transaction runs; `&PgPool` converts into
/// one with the defaults (the server's isolation level, unique violations
/// permanent, unknown `COMMIT`s looked up).
#[derive(Debug, Clone, Copy)]
pub struct Transaction<'p> {
    pool: &'p PgPool,
    isolation: Isolation,
    read_only: bool,
    retry_unique: bool,
}

impl<'p> Transaction<'p> {
    /// Transactions on connections of `pool`.
    #[must_use]
    pub fn on(pool: &'p PgPool) -> Self {
        Self {
            pool,
            isolation: Isolation::Default,
            read_only: false,
            retry_unique: false,
        }
    }

    /// The isolation level of every attempt.
    #[must_use]
    pub fn isolation(mut self, isolation: Isolation) -> Self {
        self.isolation = isolation;
        self
    }

    /// `SERIALIZABLE`, the level at which PostgreSQL guarantees that a set
    /// of transactions that commit behaves as some serial order of them.
    #[must_use]
    pub fn serializable(self) -> Self {
        self.isolation(Isolation::Serializable)
    }

    /// `REPEATABLE READ`.
    #[must_use]
    pub fn repeatable_read(self) -> Self {
        self.isolation(Isolation::RepeatableRead)
    }

    /// `READ ONLY` transactions: nothing to look up after a lost `COMMIT`
    /// reply, and the id read before `COMMIT` is skipped.
    #[must_use]
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// Treat `23505` (unique violation) and `23P01` (exclusion violation) as
    /// not executed: the transaction is rerun. PostgreSQL's documentation
    /// allows it where the conflict is with a concurrent transaction that
    /// inserted the same key (a closure that checks for the row, then
    /// inserts it, sees the row on its rerun). A conflict with a row that was
    /// already there repeats on every rerun until the attempts run out, so
    /// leave it off unless the closure looks before it writes.
    #[must_use]
    pub fn retry_unique_violation(mut self, on: bool) -> Self {
        self.retry_unique = on;
        self
    }

    fn begin_sql(&self, remaining: Duration, call_left: Duration) -> String {
        begin_sql(self.isolation, self.read_only, remaining, call_left)
    }
}

/// `BEGIN` at `isolation`, with every statement bounded by `remaining`
/// (the attempt's time left) and the time between statements by
/// `call_left` (the call's).
fn begin_sql(
    isolation: Isolation,
    read_only: bool,
    remaining: Duration,
    call_left: Duration,
) -> String {
    let level = match isolation {
        Isolation::Default => "",
        Isolation::ReadCommitted => " ISOLATION LEVEL READ COMMITTED",
        Isolation::RepeatableRead => " ISOLATION LEVEL REPEATABLE READ",
        Isolation::Serializable => " ISOLATION LEVEL SERIALIZABLE",
    };
    let mode = if read_only { " READ ONLY" } else { "" };
    // Zero would disable the timeouts: at least one millisecond.
    let ms = |d: Duration| d.as_millis().clamp(1, i32::MAX as u128);
    // A transaction whose client stalls (a task not polled, a process
    // frozen) is ended by the server, its locks released, once it has sat
    // idle for the call's time left: never past the call's deadline. The
    // call's, not the attempt's: a `COMMIT` the network holds past the
    // attempt is still the door's to resolve (it looks the transaction up
    // until the deadline), and must not be cut on the server meanwhile.
    format!(
        "BEGIN{level}{mode}; SET LOCAL statement_timeout = {}; \
         SET LOCAL idle_in_transaction_session_timeout = {}",
        ms(remaining),
        ms(call_left)
    )
}

impl<'p> From<&'p PgPool> for Transaction<'p> {
    fn from(pool: &'p PgPool) -> Self {
        Self::on(pool)
    }
}

/// The first error the database returned inside an attempt: it aborted the
/// transaction, whatever the closure did with it.
#[derive(Debug)]
struct Taint {
    verdict: Verdict,
    code: Option<String>,
    message: String,
}

/// The taint of the attempt under way, shared by its [`Tx`] and the
/// classifier.
#[derive(Debug)]
struct Taints {
    first: Mutex<Option<Taint>>,
    retry_unique: bool,
}

impl Taints {
    fn first(&self) -> std::sync::MutexGuard<'_, Option<Taint>> {
        self.first
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Mark the attempt with `err` unless an earlier error did.
    fn mark(&self, err: &SqlxError, phase: Phase) {
        let mut first = self.first();
        if first.is_none() {
            *first = Some(Taint {
                verdict: verdict(err, phase, self.retry_unique),
                code: err
                    .as_database_error()
                    .and_then(|d| d.code().map(Cow::into_owned)),
                message: err.to_string(),
            });
        }
    }

    /// [`mark`](Self::mark) for an error a statement returned, when it
    /// aborts the transaction: one from the server or the connection. A
    /// client-side error (encoding a value, decoding a row, `RowNotFound`)
    /// does not.
    fn statement_failed(&self, err: &SqlxError) {
        if matches!(
            err,
            SqlxError::Database(_)
                | SqlxError::Io(_)
                | SqlxError::Protocol(_)
                | SqlxError::WorkerCrashed
        ) {
            self.mark(err, Phase::BeforeCommit);
        }
    }
}

/// What the door knows of the attempt under way, shared by the attempt, the
/// classifier and the look-up (one call at a time: no lock is held across
/// an `.await`).
struct Shared<T> {
    taints: Arc<Taints>,
    state: Mutex<State<T>>,
}

struct State<T> {
    /// The transaction's id, when it has one (it wrote).
    xid: Option<String>,
    /// The server's life when the id was read ([`GENERATION`]).
    generation: String,
    /// The closure's value while `COMMIT` is in flight: `Some` exactly when
    /// the latest attempt sent `COMMIT` and its outcome is not known yet.
    pending: Option<T>,
    /// No look-up runs past this.
    call_deadline: Option<Instant>,
}

impl<T> Shared<T> {
    fn new(retry_unique: bool) -> Self {
        Self {
            taints: Arc::new(Taints {
                first: Mutex::new(None),
                retry_unique,
            }),
            state: Mutex::new(State {
                xid: None,
                generation: String::new(),
                pending: None,
                call_deadline: None,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// An attempt's transaction, as the closure sees it: an [`Executor`], used
/// as `&mut *tx` where `sqlx` takes one. Every statement goes through it, so
/// an error the closure swallows still marks the attempt (see the
/// [module docs](self#the-two-traps)); there is no `commit` or `rollback`:
/// the door does both.
pub struct Tx {
    tx: sqlx_core::transaction::Transaction<'static, Postgres>,
    taints: Arc<Taints>,
}

impl fmt::Debug for Tx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx").finish_non_exhaustive()
    }
}

impl<'t> Executor<'t> for &'t mut Tx {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, SqlxError>>
    where
        't: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let taints = &*self.taints;
        Box::pin(
            (&mut *self.tx)
                .fetch_many(query)
                .inspect_err(move |e| taints.statement_failed(e)),
        )
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, SqlxError>>
    where
        't: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let taints = &*self.taints;
        (&mut *self.tx)
            .fetch_optional(query)
            .inspect_err(move |e| taints.statement_failed(e))
            .boxed()
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, SqlxError>>
    where
        't: 'e,
    {
        let taints = &*self.taints;
        (&mut *self.tx)
            .prepare_with(sql, parameters)
            .inspect_err(move |e| taints.statement_failed(e))
            .boxed()
    }

    fn describe<'e>(
        self,
        sql: SqlStr,
    ) -> BoxFuture<'e, Result<sqlx_core::describe::Describe<Postgres>, SqlxError>>
    where
        't: 'e,
    {
        let taints = &*self.taints;
        (&mut *self.tx)
            .describe(sql)
            .inspect_err(move |e| taints.statement_failed(e))
            .boxed()
    }
}

/// The pause between two `pg_xact_status` look-ups of a transaction still
/// in progress.
const LOOK_AGAIN: Duration = Duration::from_millis(20);

/// How long before the call's deadline the look-ups give up.
const MARGIN: Duration = Duration::from_millis(5);

/// `COMMIT` is not sent with less than this left before the call's
/// deadline (the transaction is rolled back instead: not executed).
const COMMIT_ROOM: Duration = Duration::from_millis(25);

/// The wait for `COMMIT`'s reply ends this long before the call's deadline,
/// leaving the look-up room for one round trip.
const LOOKUP_ROOM: Duration = Duration::from_millis(15);

/// The server's life, as one string: when the postmaster started, when its
/// shared statistics were last reset (crash recovery resets them, also
/// after one backend's crash, which restarts every backend without
/// restarting the postmaster), and the WAL timeline (a promoted standby
/// has a new one). Every event after which PostgreSQL may hand out again
/// a transaction id it had handed out before (crash recovery, a failover,
/// a restore) changes it; so does a manual `pg_stat_reset_shared`, which
/// only makes the door more careful. Epoch seconds, so that the session's
/// `TimeZone` and `DateStyle` do not matter.
macro_rules! generation {
    () => {
        "concat_ws('/', extract(epoch FROM pg_postmaster_start_time()), \
         extract(epoch FROM (SELECT stats_reset FROM pg_stat_bgwriter)), \
         left(pg_walfile_name(pg_current_wal_lsn()), 8))"
    };
}

/// Read before `COMMIT`, in one round trip: the transaction's id and the
/// server's life.
const ID_AND_GENERATION: &str = concat!(
    "SELECT pg_current_xact_id_if_assigned()::text, ",
    generation!()
);

/// The look-up: the id's status and the server's life. For an id not
/// handed out yet `pg_xact_status` fails with [`IN_THE_FUTURE`].
const STATUS_AND_GENERATION: &str = concat!("SELECT pg_xact_status($1::xid8), ", generation!());

/// The SQLSTATE of `pg_xact_status` for an id not handed out yet
/// ("transaction ID … is in the future", `invalid_parameter_value`; the id
/// is the only parameter, and a valid `xid8`).
const IN_THE_FUTURE: &str = "22023";

/// When the look-ups must have ended: [`MARGIN`] before the deadline.
fn look_up_end(deadline: Option<Instant>) -> Option<Instant> {
    deadline.map(|d| d.checked_sub(MARGIN).unwrap_or(d))
}

/// The default look-up after an unknown `COMMIT`: `pg_xact_status` of the
/// attempt's transaction, on another connection of the pool.
///
/// A committed transaction's id is durable and never handed out again; an
/// id whose transaction never reached the disk is handed out again after
/// crash recovery or a failover. So when the server's life changed since
/// the id was read, `committed` may be another transaction's: the outcome
/// stays unknown. `aborted` and `in the future` mean not committed in
/// either case (a transaction that committed would still have its id);
/// `in progress` is looked at again.
async fn xact_status<T, E: From<SqlxError>>(
    pool: &PgPool,
    shared: &Shared<T>,
) -> Result<Option<T>, E> {
    let (xid, generation, deadline) = {
        let mut st = shared.state();
        match st.xid.clone() {
            // It wrote nothing: committed or not, its value stands.
            None => return Ok(st.pending.take()),
            Some(xid) => (xid, st.generation.clone(), st.call_deadline),
        }
    };
    // The last look-up ends this long before the deadline, so that the call
    // stops with the unknown outcome, not with the deadline.
    let end = look_up_end(deadline);
    // The last answer the server gave: when the deadline cuts a later
    // look-up short, that answer is still the best account of the outcome.
    let mut seen: Option<String> = None;
    loop {
        let query = sqlx_core::query_as::query_as(STATUS_AND_GENERATION)
            .bind(&xid)
            .fetch_one(pool);
        let answer: Result<(Option<String>, String), SqlxError> = match end {
            Some(end) => {
                let Ok(answer) = tokio::time::timeout_at(end.into(), query).await else {
                    let status = match seen {
                        Some(last) => {
                            format!("{last} when last asked, then no answer before the deadline")
                        }
                        None => "no answer before the deadline".to_owned(),
                    };
                    return Err(unresolved(&xid, &status).into());
                };
                answer
            }
            None => query.await,
        };
        let future = answer.as_ref().is_err_and(|e| {
            e.as_database_error()
                .and_then(DatabaseError::code)
                .is_some_and(|c| c == IN_THE_FUTURE)
        });
        if future {
            shared.state().pending = None;
            return Ok(None);
        }
        let last = match answer
            .as_ref()
            .map(|(s, g)| (s.as_deref(), *g == generation))
        {
            Ok((Some("committed"), true)) => return Ok(shared.state().pending.take()),
            Ok((Some("committed"), false)) => {
                return Err(unresolved(
                    &xid,
                    "'committed', but the server restarted or failed over since the id was \
                     read, and after that PostgreSQL may give the id of a transaction that \
                     never reached the disk to another one; a reconcile by the call's key \
                     can tell",
                )
                .into());
            }
            Ok((Some("aborted"), _)) => {
                shared.state().pending = None;
                return Ok(None);
            }
            Ok((Some(other), _)) => format!("'{other}'"),
            // Too old for the commit log: nobody can tell any more.
            Ok((None, _)) => return Err(unresolved(&xid, "no status (too old)").into()),
            Err(e) => format!("the look-up failed: {e}"),
        };
        if end.is_none_or(|end| retries_core::door::now() + LOOK_AGAIN >= end) {
            return Err(unresolved(&xid, &last).into());
        }
        if answer.is_ok() {
            seen = Some(last);
        }
        tokio::time::sleep(LOOK_AGAIN).await;
    }
}

/// The outcome of the `COMMIT` of transaction `xid` stayed unknown.
fn unresolved(xid: &str, status: &str) -> SqlxError {
    DoorError::sqlx(
        "40003",
        format!(
            "the COMMIT of transaction {xid} was sent and its reply lost; \
             its outcome is unknown (pg_xact_status: {status})"
        ),
    )
}

/// The outcome of a `COMMIT` stayed unknown, with no id to name (the
/// builder's `reconcile` looks by the call's key instead).
fn unknown_commit(why: &str) -> SqlxError {
    DoorError::sqlx(
        "40003",
        format!("the COMMIT was sent and its reply lost; its outcome is unknown ({why})"),
    )
}

/// The closure of a transaction, in one of its two forms.
trait Body<T, E> {
    fn call<'t>(
        &'t mut self,
        tx: &'t mut Tx,
        at: &'t Attempt,
    ) -> impl Future<Output = Result<T, E>>;
}

/// An `async` closure ([`Transactions::transaction`]).
struct AsyncBody<F>(F);

impl<T, E, F: AsyncFnMut(&mut Tx, &Attempt) -> Result<T, E>> Body<T, E> for AsyncBody<F> {
    fn call<'t>(
        &'t mut self,
        tx: &'t mut Tx,
        at: &'t Attempt,
    ) -> impl Future<Output = Result<T, E>> {
        (self.0)(tx, at)
    }
}

/// A closure returning a boxed `Send` future ([`Transactions::transaction_fn`]).
struct BoxedBody<F>(F);

impl<T, E, F> Body<T, E> for BoxedBody<F>
where
    F: for<'t> FnMut(&'t mut Tx, &'t Attempt) -> BoxFuture<'t, Result<T, E>>,
{
    fn call<'t>(
        &'t mut self,
        tx: &'t mut Tx,
        at: &'t Attempt,
    ) -> impl Future<Output = Result<T, E>> {
        (self.0)(tx, at)
    }
}

/// One attempt: begin, the closure, the id, commit.
async fn attempt<T, E, F>(
    opts: &Transaction<'_>,
    read_xid: bool,
    shared: &Shared<T>,
    body: &mut F,
    at: &Attempt,
) -> Result<T, E>
where
    E: From<SqlxError>,
    F: Body<T, E>,
{
    *shared.taints.first() = None;
    {
        let mut st = shared.state();
        st.xid = None;
        st.pending = None;
        st.call_deadline = Some(at.call_deadline());
    }
    // One clock read for both bounds.
    let now = retries_core::door::now();
    let sql = opts.begin_sql(
        at.deadline().saturating_duration_since(now),
        at.call_deadline().saturating_duration_since(now),
    );
    let tx = match opts.pool.begin_with(AssertSqlSafe(sql)).await {
        Ok(tx) => tx,
        Err(e) => {
            shared.taints.mark(&e, Phase::BeforeCommit);
            return Err(e.into());
        }
    };
    let mut tx = Tx {
        tx,
        taints: shared.taints.clone(),
    };
    let value = body.call(&mut tx, at).await?;
    if let Some(t) = shared.taints.first().as_ref() {
        // The closure went on after the transaction was aborted.
        let message = format!(
            "the transaction was aborted by an error the closure did not return: {}",
            t.message
        );
        return Err(
            DoorError::sqlx(t.code.clone().unwrap_or_else(|| "08006".into()), message).into(),
        );
    }
    let Tx { mut tx, .. } = tx;
    if read_xid {
        let id: Result<(Option<String>, String), SqlxError> =
            sqlx_core::query_as::query_as(ID_AND_GENERATION)
                .fetch_one(&mut *tx)
                .await;
        match id {
            Ok((id, generation)) => {
                let mut st = shared.state();
                st.xid = id;
                st.generation = generation;
            }
            Err(e) => {
                shared.taints.mark(&e, Phase::BeforeCommit);
                return Err(e.into());
            }
        }
    }
    // `COMMIT` is sent only with room left for its reply and one look-up:
    // closer to the deadline the transaction is rolled back (not executed),
    // which the caller can act on, rather than left unknown.
    let deadline = at.call_deadline();
    if retries_core::door::add(retries_core::door::now(), COMMIT_ROOM) >= deadline {
        let e = SqlxError::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "too close to the call's deadline to send COMMIT: rolled back",
        ));
        shared.taints.mark(&e, Phase::BeforeCommit);
        return Err(e.into());
    }
    shared.state().pending = Some(value);
    let reply_by = deadline.checked_sub(LOOKUP_ROOM).unwrap_or(deadline);
    let committed = match tokio::time::timeout_at(reply_by.into(), tx.commit()).await {
        Ok(done) => done,
        // Sent, unanswered: unknown (the look-up keeps its room).
        Err(_) => Err(SqlxError::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "COMMIT had no reply before the call's deadline",
        ))),
    };
    match committed {
        Ok(()) => Ok(shared
            .state()
            .pending
            .take()
            .expect("the value is kept until COMMIT returns")),
        Err(e) => {
            shared.taints.mark(&e, Phase::Commit);
            Err(e.into())
        }
    }
}

/// The one loop of the door, for both forms of the closure and both
/// look-ups: the builder's `reconcile` when it has one, else
/// [`xact_status`]; neither is asked when `COMMIT` was never sent.
async fn drive<'a, I, T, E, C, R, H, B, K, L, F>(
    retry: Retry<'a, I, C, R, H, B, K, NoRetryIf, L>,
    on: Transaction<'_>,
    mut body: F,
) -> Result<T, Failure<E>>
where
    E: From<SqlxError>,
    F: Body<T, E>,
    C: Classifier<E>,
    R: Reconciler<T, E>,
    H: OnRetry<E>,
    B: Budget,
    K: Breaker,
    L: LimitSlot<'a>,
{
    let shared = Shared::<T>::new(on.retry_unique);
    let retry = retry.into_parts();
    let mut user = retry.reconcile;
    let inner = retry.classify;
    let taints = &*shared.taints;
    let this = Parts {
        policy: retry.policy,
        idempotency: NotIdempotent,
        classify: ClassifyWith::new(move |e: &E| match taints.first().as_ref() {
            Some(t) => t.verdict,
            None => inner.verdict(e),
        }),
        reconcile: ReconcileWith::new(|key: IdempotencyKey| {
            let sent = shared.state().pending.is_some();
            let theirs = if sent { user.lookup(key) } else { None };
            let shared = &shared;
            async move {
                match theirs {
                    _ if !sent => Ok(None),
                    // Bounded like the door's own look-up, so that the call
                    // stops with the outcome unknown, not with the deadline.
                    Some(f) => {
                        let end = look_up_end(shared.state().call_deadline);
                        match end {
                            Some(end) => tokio::time::timeout_at(end.into(), f)
                                .await
                                .unwrap_or_else(|_| {
                                    Err(unknown_commit(
                                        "the reconcile look-up had no answer before the deadline",
                                    )
                                    .into())
                                }),
                            None => f.await,
                        }
                    }
                    None => xact_status(on.pool, shared).await,
                }
            }
        }),
        on_retry: retry.on_retry,
        budget: retry.budget,
        breaker: retry.breaker,
        nested: retry.nested,
        name: retry.name,
        retry_if: NoRetryIf,
        slots: retry.slots,
    }
    .into_retry();
    // The id is read for the default look-up only: a read-only transaction
    // has none, and the builder's `reconcile` looks by the call's key.
    let read_xid = !R::LOOKS_UP && !on.read_only;
    let out = retries_core::door::door_loop!(this, None, Result<T, E>, |at| attempt(&on, read_xid, &shared, &mut body, at));
    // The deadline stopped the call with `COMMIT` sent and its outcome not
    // found (its reply, or the look-up, came too late on a busy machine):
    // unknown, never "nothing happened in time".
    let unresolved_commit = shared.state().pending.is_some();
    match out {
        Err(f) if unresolved_commit => Err(retries_core::door::unknown_at_deadline(f, || {
            let xid = shared.state().xid.clone();
            match xid {
                Some(xid) => unresolved(&xid, "no answer before the deadline").into(),
                None => unknown_commit("no answer before the deadline").into(),
            }
        })),
        out => out,
    }
}

/// What a `transaction()` caller gets for a stop: an unknown outcome is
/// the look-up's error, which says so and names the transaction (SQLSTATE
/// `40003`), not the `COMMIT`'s I/O error; a budget that refused the rerun
/// is a [`Stopped`] (its source the last database error), so that the
/// caller can tell the library gave up from the database's own error;
/// every other stop as by [`Failure::into_error`].
fn stop_to_error<E>(f: Failure<E>) -> E
where
    E: From<Stopped> + Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match f.reason() {
        retries_core::Reason::UnknownOutcome if f.reconcile_error().is_some() => {
            f.into_reconcile_error().expect("checked above")
        }
        retries_core::Reason::BudgetExhausted => E::from(f.into_stopped()),
        _ => f.into_error(),
    }
}

/// The transaction door on a call's spec: `use retries_sqlx::Transactions;`
/// and `retries::call(&POLICY).transaction(…)`. Implemented for the spec
/// before an idempotency is declared (the door declares the work not
/// idempotent itself, with the `pg_xact_status` look-up) and after
/// `.not_idempotent()` (with the builder's `reconcile` when one is given:
/// asked after an unknown `COMMIT`, by the call's idempotency key, in place
/// of the look-up). Sealed.
///
/// The futures are `Send` wherever the closure's are: called on a spec (a
/// concrete type), the future of each method is the implementation's own.
pub trait Transactions<'a, C, R, H>: sealed::Sealed + Sized {
    /// Run `op` as one PostgreSQL transaction per attempt, rerun whole when
    /// the database rolled it back; after an unknown `COMMIT`, the builder's
    /// `reconcile` if it has one, else the `pg_xact_status` look-up, says
    /// whether it committed. See the [crate docs](crate) for the verdicts
    /// and the two traps. The door declares the work not idempotent (a
    /// transaction's writes seldom are): it is rerun only when it was
    /// certainly not committed. A stop is mapped to `E` as by `run`.
    fn transaction<'o, T, E, F>(
        self,
        on: impl Into<Transaction<'o>>,
        op: F,
    ) -> impl Future<Output = Result<T, E>>
    where
        E: From<SqlxError> + From<Stopped> + Into<Box<dyn std::error::Error + Send + Sync>>,
        F: AsyncFnMut(&mut Tx, &Attempt) -> Result<T, E>,
        C: Classifier<E>,
        R: Reconciler<T, E>,
        H: OnRetry<E>;

    /// [`transaction`](Self::transaction), returning the [`Failure`]
    /// describing a stop.
    fn transaction_outcome<'o, T, E, F>(
        self,
        on: impl Into<Transaction<'o>>,
        op: F,
    ) -> impl Future<Output = Result<T, Failure<E>>>
    where
        E: From<SqlxError>,
        F: AsyncFnMut(&mut Tx, &Attempt) -> Result<T, E>,
        C: Classifier<E>,
        R: Reconciler<T, E>,
        H: OnRetry<E>;

    /// [`transaction`](Self::transaction) for a closure that returns a boxed
    /// future (`|tx, at| Box::pin(async move { … })`, as `sqlx`'s own
    /// `Connection::transaction` takes): the call's future is then `Send`
    /// (in `tokio::spawn`, an axum handler) wherever the closure is, which
    /// an `async` closure's currently is not (rust-lang/rust#138207).
    fn transaction_fn<'o, T, E, F>(
        self,
        on: impl Into<Transaction<'o>>,
        op: F,
    ) -> impl Future<Output = Result<T, E>>
    where
        E: From<SqlxError> + From<Stopped> + Into<Box<dyn std::error::Error + Send + Sync>>,
        F: for<'t> FnMut(&'t mut Tx, &'t Attempt) -> BoxFuture<'t, Result<T, E>>,
        C: Classifier<E>,
        R: Reconciler<T, E>,
        H: OnRetry<E>;
}

mod sealed {
    pub trait Sealed {}
}

/// The trait's two implementations, one body.
macro_rules! tx_doors {
    ($idem:ty) => {
        impl<C, R, H, B, K, L> sealed::Sealed for Retry<'_, $idem, C, R, H, B, K, NoRetryIf, L> {}

        impl<'a, C, R, H, B, K, L> Transactions<'a, C, R, H>
            for Retry<'a, $idem, C, R, H, B, K, NoRetryIf, L>
        where
            B: Budget,
            K: Breaker,
            L: LimitSlot<'a>,
        {
            async fn transaction<'o, T, E, F>(
                self,
                on: impl Into<Transaction<'o>>,
                op: F,
            ) -> Result<T, E>
            where
                E: From<SqlxError> + From<Stopped> + Into<Box<dyn std::error::Error + Send + Sync>>,
                F: AsyncFnMut(&mut Tx, &Attempt) -> Result<T, E>,
                C: Classifier<E>,
                R: Reconciler<T, E>,
                H: OnRetry<E>,
            {
                drive(self, on.into(), AsyncBody(op))
                    .await
                    .map_err(stop_to_error)
            }

            async fn transaction_outcome<'o, T, E, F>(
                self,
                on: impl Into<Transaction<'o>>,
                op: F,
            ) -> Result<T, Failure<E>>
            where
                E: From<SqlxError>,
                F: AsyncFnMut(&mut Tx, &Attempt) -> Result<T, E>,
                C: Classifier<E>,
                R: Reconciler<T, E>,
                H: OnRetry<E>,
            {
                drive(self, on.into(), AsyncBody(op)).await
            }

            async fn transaction_fn<'o, T, E, F>(
                self,
                on: impl Into<Transaction<'o>>,
                op: F,
            ) -> Result<T, E>
            where
                E: From<SqlxError> + From<Stopped> + Into<Box<dyn std::error::Error + Send + Sync>>,
                F: for<'t> FnMut(&'t mut Tx, &'t Attempt) -> BoxFuture<'t, Result<T, E>>,
                C: Classifier<E>,
                R: Reconciler<T, E>,
                H: OnRetry<E>,
            {
                drive(self, on.into(), BoxedBody(op))
                    .await
                    .map_err(stop_to_error)
            }
        }
    };
}

tx_doors!(Undeclared);
tx_doors!(NotIdempotent);

#[cfg(test)]
mod tests {
    use super::*;
    use retries_core::Classify;
    use retries_core::VerdictKind::{self, NotExecuted, Permanent, Unknown};

    fn db(code: &'static str) -> SqlxError {
        DoorError::sqlx(code, format!("SQLSTATE {code}"))
    }

    fn kinds(err: &SqlxError, unique: bool) -> [VerdictKind; 3] {
        [Phase::BeforeCommit, Phase::Commit, Phase::Autocommit]
            .map(|p| verdict(err, p, unique).kind())
    }

    #[test]
    fn the_table_by_sqlstate_and_phase() {
        let rows: [(&'static str, [VerdictKind; 3]); 13] = [
            ("40001", [NotExecuted, NotExecuted, NotExecuted]),
            ("40P01", [NotExecuted, NotExecuted, NotExecuted]),
            ("40003", [Unknown, Unknown, Unknown]),
            ("08006", [NotExecuted, Unknown, Unknown]),
            ("08000", [NotExecuted, Unknown, Unknown]),
            ("57P01", [NotExecuted, Unknown, Unknown]),
            ("08001", [NotExecuted, NotExecuted, NotExecuted]),
            ("57P03", [NotExecuted, NotExecuted, NotExecuted]),
            ("53300", [NotExecuted, NotExecuted, NotExecuted]),
            ("23505", [Permanent, Permanent, Permanent]),
            ("23503", [Permanent, Permanent, Permanent]),
            ("57014", [NotExecuted, Permanent, Permanent]),
            ("42601", [Permanent, Permanent, Permanent]),
        ];
        for (code, expected) in rows {
            assert_eq!(kinds(&db(code), false), expected, "{code}");
        }
        assert_eq!(kinds(&db("23505"), true), [NotExecuted; 3]);
        assert_eq!(kinds(&db("23P01"), true), [NotExecuted; 3]);
        assert_eq!(
            kinds(&db("23503"), true),
            [Permanent; 3],
            "only unique and exclusion violations"
        );
    }

    #[test]
    fn errors_that_are_not_the_servers() {
        let reset = SqlxError::Io(std::io::ErrorKind::ConnectionReset.into());
        assert_eq!(kinds(&reset, false), [NotExecuted, Unknown, Unknown]);
        let refused = SqlxError::Io(std::io::ErrorKind::ConnectionRefused.into());
        assert_eq!(kinds(&refused, false), [NotExecuted; 3]);
        assert_eq!(kinds(&SqlxError::PoolTimedOut, false), [NotExecuted; 3]);
        assert_eq!(
            kinds(&SqlxError::WorkerCrashed, false),
            [NotExecuted, Unknown, Unknown]
        );
        for e in [
            SqlxError::RowNotFound,
            SqlxError::PoolClosed,
            SqlxError::ColumnNotFound("x".into()),
        ] {
            assert_eq!(kinds(&e, false), [Permanent; 3], "{e}");
        }
    }

    #[test]
    fn classify_outside_the_door_is_autocommit() {
        assert_eq!(
            SqlxError::Io(std::io::ErrorKind::ConnectionReset.into())
                .classify()
                .kind(),
            Unknown
        );
        assert_eq!(db("40001").classify().kind(), NotExecuted);
        // Found in a chain, as a boxed application error holds it.
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(SqlxError::PoolTimedOut);
        assert_eq!(
            retries_core::classify_chain(&*boxed).map(|v| v.kind()),
            Some(NotExecuted)
        );
    }

    #[test]
    fn a_stop_travels_as_a_sqlx_error_and_stays_permanent() {
        let stopped = Stopped::new(
            retries_core::Reason::DeadlineExceeded,
            2,
            Duration::from_millis(5),
        );
        let as_sqlx = SqlxError::from(stopped);
        assert!(as_sqlx.to_string().contains("deadline"), "{as_sqlx}");
        assert_eq!(kinds(&as_sqlx, true), [Permanent; 3]);
        let saturated = SqlxError::from(Stopped::new(
            retries_core::Reason::Saturated,
            0,
            Duration::ZERO,
        ));
        assert_eq!(saturated.classify().kind(), NotExecuted);
    }

    #[test]
    fn begin_carries_the_isolation_and_the_attempts_time() {
        assert_eq!(
            begin_sql(
                Isolation::Default,
                false,
                Duration::from_millis(1500),
                Duration::from_secs(4)
            ),
            "BEGIN; SET LOCAL statement_timeout = 1500; \
             SET LOCAL idle_in_transaction_session_timeout = 4000"
        );
        assert_eq!(
            begin_sql(
                Isolation::Serializable,
                true,
                Duration::ZERO,
                Duration::ZERO
            ),
            "BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY; SET LOCAL statement_timeout = 1; \
             SET LOCAL idle_in_transaction_session_timeout = 1",
            "zero would switch the timeouts off"
        );
        assert_eq!(
            begin_sql(
                Isolation::RepeatableRead,
                false,
                Duration::from_secs(1 << 40),
                Duration::from_secs(1 << 40)
            ),
            format!(
                "BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL statement_timeout = {0}; \
                 SET LOCAL idle_in_transaction_session_timeout = {0}",
                i32::MAX
            )
        );
    }
}
