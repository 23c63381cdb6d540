//! What a transaction runs on: a pool, with its isolation level and
//! access mode ([`Transaction`]), and the `BEGIN` of each attempt.

#[allow(clippy::wildcard_imports)]
use super::*;

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
    pub(crate) pool: &'p PgPool,
    isolation: Isolation,
    pub(crate) read_only: bool,
    pub(crate) retry_unique: bool,
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

    pub(crate) fn begin_sql(&self, remaining: Duration, call_left: Duration) -> String {
        begin_sql(self.isolation, self.read_only, remaining, call_left)
    }
}

/// `BEGIN` at `isolation`, with every statement bounded by `remaining`
/// (the attempt's time left) and the time between statements by
/// `call_left` (the call's).
pub(crate) fn begin_sql(
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
