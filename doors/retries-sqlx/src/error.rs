//! The errors of the door: the one it reports itself as a `sqlx` error
//! ([`DoorError`]) and the closure's error type it offers ([`Error`]).

#[allow(clippy::wildcard_imports)]
use super::*;

/// An error the door reports itself, as a `sqlx::Error::Database` so that
/// it travels through the closure's own error type: the replay of an error
/// the closure swallowed (with its SQLSTATE), or a `COMMIT` whose outcome
/// stayed unknown (`40003`).
#[derive(Debug)]
pub struct DoorError {
    pub(crate) code: Cow<'static, str>,
    pub(crate) message: String,
}

impl DoorError {
    pub(crate) fn sqlx(code: impl Into<Cow<'static, str>>, message: String) -> SqlxError {
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
