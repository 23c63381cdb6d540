//! `sqlx` 0.9 (feature `sqlx-0.9`): [`Classify`] for `sqlx::Error`, and the
//! SQLSTATE table a database door applies by phase. The transaction door
//! (a transaction rerun whole when PostgreSQL rolled it back, a lost
//! `COMMIT` resolved) is the crate `retries-sqlx`, built on this table.
//!
//! # Verdicts, by SQLSTATE and phase
//!
//! PostgreSQL aborts a transaction at its first error, and a transaction whose
//! `COMMIT` was never sent never commits. So everything before `COMMIT` is
//! **not executed**; a connection lost *during* `COMMIT` leaves the outcome
//! **unknown**.
//!
//! | error | before `COMMIT` | during `COMMIT` | autocommit ([`Classify`] for `sqlx::Error`) |
//! |---|---|---|---|
//! | `40001` serialization failure, `40P01` deadlock | not executed | not executed | not executed |
//! | `40003` statement completion unknown (CockroachDB) | unknown | unknown | unknown |
//! | class `08` connection errors, `57P01`/`57P02` shutdown, I/O errors, protocol errors, a crashed worker | not executed | unknown | unknown |
//! | `08001`, `08004`, `57P03` cannot connect now, `53300` too many connections, refused connections, `PoolTimedOut` | not executed | not executed | not executed |
//! | `23505` unique violation, `23P01` exclusion violation | permanent (not executed when the door is told to retry them) | the same | the same |
//! | other constraint violations (class `23`), every other error | permanent | permanent | permanent |
//!
//! `57014` (a statement cancelled, by the attempt's own `statement_timeout`
//! among others) is not executed before `COMMIT`: it aborted the transaction.
//! A [`Stopped`] carried as a database error (a door's own stop) classifies
//! as the stop it is.

use sqlx_core::error::{DatabaseError, Error as SqlxError, ErrorKind};

use crate::failure::Stopped;
use crate::verdict::{Classify, Verdict, classify_io_kind};

/// Where in a transaction an error arose; the columns of the
/// [table](self#verdicts-by-sqlstate-and-phase).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Inside a transaction, before `COMMIT` was sent (`BEGIN` and taking a
    /// connection included): whatever failed, nothing was committed.
    BeforeCommit,
    /// `COMMIT` was sent: the transaction may have committed.
    Commit,
    /// A statement on its own (its own implicit transaction): once sent, a
    /// lost reply leaves its outcome unknown.
    Autocommit,
}

/// The verdict for `err` in `phase`, by the table of the
/// [module docs](self#verdicts-by-sqlstate-and-phase). With
/// `retry_unique_violation`, `23505` and `23P01` are not executed
/// instead of permanent.
#[must_use]
pub fn verdict(err: &SqlxError, phase: Phase, retry_unique_violation: bool) -> Verdict {
    match err {
        SqlxError::Database(db) if let Some(stopped) = db.try_downcast_ref::<Stopped>() => {
            stopped.classify()
        }
        SqlxError::Database(db) => match db.code() {
            Some(code) => sqlstate_verdict(&code, phase, retry_unique_violation),
            None => Verdict::permanent(),
        },
        SqlxError::PoolTimedOut => Verdict::not_executed(),
        SqlxError::Io(io) => match classify_io_kind(io.kind()).kind() {
            crate::VerdictKind::NotExecuted => Verdict::not_executed(),
            _ => lost(phase),
        },
        SqlxError::Protocol(_) | SqlxError::WorkerCrashed => lost(phase),
        _ => Verdict::permanent(),
    }
}

/// The verdict for a SQLSTATE `code` in `phase` (the database rows of the
/// table).
#[must_use]
pub fn sqlstate_verdict(code: &str, phase: Phase, retry_unique_violation: bool) -> Verdict {
    match code {
        // Rolled back by the server after losing to a concurrent
        // transaction: the expected cost of SERIALIZABLE, not an unhealthy
        // server (no budget drawn, the breaker not told).
        "40001" | "40P01" => Verdict::not_executed().with_conflict(),
        // Refused while connecting (nothing was ever sent).
        "08001" | "08004" | "57P03" | "53300" => Verdict::not_executed(),
        "40003" => Verdict::unknown(),
        "57P01" | "57P02" => lost(phase),
        c if c.starts_with("08") => lost(phase),
        "23505" | "23P01" if retry_unique_violation => Verdict::not_executed(),
        "57014" if phase == Phase::BeforeCommit => Verdict::not_executed(),
        _ => Verdict::permanent(),
    }
}

/// A connection lost in `phase`.
fn lost(phase: Phase) -> Verdict {
    match phase {
        Phase::BeforeCommit => Verdict::not_executed(),
        Phase::Commit | Phase::Autocommit => Verdict::unknown(),
    }
}

/// A statement outside the door: an autocommit statement, whose lost reply
/// leaves its outcome unknown (the last column of the
/// [table](self#verdicts-by-sqlstate-and-phase)).
impl Classify for SqlxError {
    fn classify(&self) -> Verdict {
        verdict(self, Phase::Autocommit, false)
    }
}

/// A stopped call as a `sqlx::Error` (through `sqlx`'s `From` for database
/// errors): so a closure returning `sqlx::Error` can use
/// the transaction door, whose stops (the deadline, an open breaker) are
/// reported in the closure's error type. It has no SQLSTATE, and classifies
/// as the [`Stopped`] it is (permanent).
impl DatabaseError for Stopped {
    fn message(&self) -> &str {
        self.reason().as_str()
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
        ErrorKind::Other
    }
}
