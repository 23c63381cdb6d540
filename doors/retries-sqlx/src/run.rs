//! One call of the door: an attempt (`BEGIN`, the closure, `COMMIT`, the
//! look-up), driven by the engine's loop, and the [`Transactions`] trait
//! that gives every spec its three methods.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The closure of a transaction, in one of its two forms.
pub(crate) trait Body<T, E> {
    fn call<'t>(
        &'t mut self,
        tx: &'t mut Tx,
        at: &'t Attempt,
    ) -> impl Future<Output = Result<T, E>>;
}

/// An `async` closure ([`Transactions::transaction`]).
pub(crate) struct AsyncBody<F>(F);

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
pub(crate) struct BoxedBody<F>(F);

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
pub(crate) async fn attempt<T, E, F>(
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
pub(crate) async fn drive<'a, S, T, E, F>(
    retry: Retry<'a, S>,
    on: Transaction<'_>,
    mut body: F,
) -> Result<T, Failure<E>>
where
    S: SlotSet<O = NoRetryIf>,
    E: From<SqlxError>,
    F: Body<T, E>,
    S::C: Classifier<E>,
    S::R: Reconciler<T, E>,
    S::H: OnRetry<E>,
    S::B: Budget,
    S::K: Breaker,
    S::L: LimitSlot<'a>,
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
        rate: retry.rate,
        pace: retry.pace,
    }
    .into_retry();
    // The id is read for the default look-up only: a read-only transaction
    // has none, and the builder's `reconcile` looks by the call's key.
    let read_xid = !<S::R as Reconciler<T, E>>::LOOKS_UP && !on.read_only;
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
/// `40003`), not the `COMMIT`'s I/O error; every other stop as by
/// [`Failure::into_error`] (a stop of the library's, such as a budget that
/// refused the rerun, is a [`Stopped`] whose source is the last database
/// error, so that the caller can tell it from the database's own error).
pub(crate) fn stop_to_error<E>(f: Failure<E>) -> E
where
    E: From<Stopped> + Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match f.reason() {
        retries_core::Reason::UnknownOutcome if f.reconcile_error().is_some() => {
            f.into_reconcile_error().expect("checked above")
        }
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
        impl<C, R, H, B, K, L> sealed::Sealed
            for Retry<'_, Slots<$idem, C, R, H, B, K, NoRetryIf, L>>
        {
        }

        impl<'a, C, R, H, B, K, L> Transactions<'a, C, R, H>
            for Retry<'a, Slots<$idem, C, R, H, B, K, NoRetryIf, L>>
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
