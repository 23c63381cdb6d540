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

pub mod durable;
mod error;
mod keys;
mod lookup;
mod run;
mod transaction;
mod tx;

pub use error::{DoorError, Error};
pub use keys::{KeyError, PgKeyStore};
pub use run::Transactions;
pub use transaction::{Isolation, Transaction};
pub use tx::Tx;
#[allow(clippy::wildcard_imports)]
use {lookup::*, tx::*};

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
use retries_core::{Retry, SlotSet, Slots};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transaction::begin_sql;
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
