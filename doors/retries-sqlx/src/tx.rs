//! The connection an attempt's closure gets ([`Tx`]): an executor that
//! remembers the first error the database returned (it aborted the
//! transaction, whatever the closure did with it).

#[allow(clippy::wildcard_imports)]
use super::*;

/// The first error the database returned inside an attempt: it aborted the
/// transaction, whatever the closure did with it.
#[derive(Debug)]
pub(crate) struct Taint {
    pub(crate) verdict: Verdict,
    pub(crate) code: Option<String>,
    pub(crate) message: String,
}

/// The taint of the attempt under way, shared by its [`Tx`] and the
/// classifier.
#[derive(Debug)]
pub(crate) struct Taints {
    first: Mutex<Option<Taint>>,
    pub(crate) retry_unique: bool,
}

impl Taints {
    pub(crate) fn first(&self) -> std::sync::MutexGuard<'_, Option<Taint>> {
        self.first
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Mark the attempt with `err` unless an earlier error did.
    pub(crate) fn mark(&self, err: &SqlxError, phase: Phase) {
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
pub(crate) struct Shared<T> {
    pub(crate) taints: Arc<Taints>,
    state: Mutex<State<T>>,
}

pub(crate) struct State<T> {
    /// The transaction's id, when it has one (it wrote).
    pub(crate) xid: Option<String>,
    /// The server's life when the id was read ([`GENERATION`]).
    pub(crate) generation: String,
    /// The closure's value while `COMMIT` is in flight: `Some` exactly when
    /// the latest attempt sent `COMMIT` and its outcome is not known yet.
    pub(crate) pending: Option<T>,
    /// No look-up runs past this.
    pub(crate) call_deadline: Option<Instant>,
}

impl<T> Shared<T> {
    pub(crate) fn new(retry_unique: bool) -> Self {
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

    pub(crate) fn state(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// An attempt's transaction, as the closure sees it: an [`Executor`], used
/// as `&mut *tx` where `sqlx` takes one. Every statement goes through it, so
/// an error the closure swallows still marks the attempt (see the
/// [module docs](crate#the-two-traps)); there is no `commit` or `rollback`:
/// the door does both.
pub struct Tx {
    pub(crate) tx: sqlx_core::transaction::Transaction<'static, Postgres>,
    pub(crate) taints: Arc<Taints>,
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
