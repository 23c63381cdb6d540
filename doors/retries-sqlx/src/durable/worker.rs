//! The worker: claims due calls, drives each through the engine under a
//! renewed lease, and writes where each call goes next.

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use retries_core::door::observe::{self, Level};
use retries_core::{
    Attempt, CircuitBreaker, Classify, Failure, IdempotencyKey, Policy, Reason, RetryEvent,
    TokenBucket, Verdict,
};
use sqlx_postgres::PgPool;
use tracing::Instrument as _;

use super::call::{Call, HandlerError};
use super::writes::{Kind, Writes};
use super::{millis, sql};

type Local<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;
type RunFn = dyn for<'a> Fn(&'a Call, &'a Attempt) -> Local<'a, Result<(), HandlerError>>;
type ReconcileFn = dyn for<'a> Fn(&'a Call) -> Local<'a, Result<bool, HandlerError>>;

/// What a worker runs for one name: the handler, its policy and whether it
/// may be sent twice, an optional `reconcile`, a budget and a breaker.
pub struct Handler {
    policy: Policy,
    idempotent: bool,
    run: Box<RunFn>,
    reconcile: Option<Box<ReconcileFn>>,
    budget: Arc<TokenBucket>,
    breaker: Option<Arc<CircuitBreaker>>,
}

impl fmt::Debug for Handler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handler")
            .field("policy", &self.policy)
            .field("idempotent", &self.idempotent)
            .field("reconcile", &self.reconcile.is_some())
            .finish_non_exhaustive()
    }
}

impl Handler {
    fn with<H, E>(policy: Policy, idempotent: bool, handler: H) -> Self
    where
        H: AsyncFn(&Call, &Attempt) -> Result<(), E> + 'static,
        E: Classify + fmt::Display,
    {
        let handler = Arc::new(handler);
        Self {
            policy,
            idempotent,
            run: Box::new(move |call, at| {
                let handler = Arc::clone(&handler);
                Box::pin(async move {
                    (*handler)(call, at)
                        .await
                        .map_err(|e| HandlerError::from_error(&e))
                })
            }),
            reconcile: None,
            budget: Arc::new(TokenBucket::DEFAULT),
            breaker: None,
        }
    }

    /// A handler that may be sent twice with the same key (the server
    /// deduplicates by it, or the effect is idempotent): an unknown
    /// outcome, a crash included, is sent again with the same key.
    pub fn idempotent<H, E>(policy: Policy, handler: H) -> Self
    where
        H: AsyncFn(&Call, &Attempt) -> Result<(), E> + 'static,
        E: Classify + fmt::Display,
    {
        Self::with(policy, true, handler)
    }

    /// A handler that must not be sent twice: an unknown outcome (a crash
    /// mid-attempt, a cut, a panic) is resolved by [`reconcile`](Self::reconcile)
    /// first, or the call is dead, `unknown_outcome`.
    pub fn not_idempotent<H, E>(policy: Policy, handler: H) -> Self
    where
        H: AsyncFn(&Call, &Attempt) -> Result<(), E> + 'static,
        E: Classify + fmt::Display,
    {
        Self::with(policy, false, handler)
    }

    /// Asked, before a call whose outcome is unknown is sent again, whether
    /// it was done (`true`: the call is done, nothing sent).
    #[must_use]
    pub fn reconcile<R, E>(mut self, reconcile: R) -> Self
    where
        R: AsyncFn(&Call) -> Result<bool, E> + 'static,
        E: Classify + fmt::Display,
    {
        let reconcile = Arc::new(reconcile);
        self.reconcile = Some(Box::new(move |call| {
            let reconcile = Arc::clone(&reconcile);
            Box::pin(async move {
                (*reconcile)(call)
                    .await
                    .map_err(|e| HandlerError::from_error(&e))
            })
        }));
        self
    }

    /// The retry budget of this name's calls (a bucket of their own
    /// otherwise).
    #[must_use]
    pub fn budget(mut self, budget: Arc<TokenBucket>) -> Self {
        self.budget = budget;
        self
    }

    /// A breaker under this name's calls (none otherwise).
    #[must_use]
    pub fn breaker(mut self, breaker: Arc<CircuitBreaker>) -> Self {
        self.breaker = Some(breaker);
        self
    }
}

/// A worker that cannot run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// No handler was given: it would claim nothing.
    #[error("a worker needs at least one handler")]
    NoHandler,
    /// A zero lease or concurrency.
    #[error("a worker's {0} must be above zero")]
    Zero(&'static str),
}

struct Entry {
    handler: Handler,
    /// The name, kept for the process (a bounded set: the handlers').
    label: &'static str,
    engine_name: &'static retries_core::observe::Name,
}

static DURABLE: retries_core::observe::Name =
    retries_core::observe::Name::new("retries_sqlx::durable").give_up_reported_by_owner();

/// A worker process's loop (see [the module](super)): it claims the due
/// calls of the names it has handlers for, at most `concurrency` at once,
/// and drives each to its end.
///
/// Its future is not `Send` (its handlers are `async` closures, whose
/// futures are not known to be): run it on the thread that awaits it
/// (`#[tokio::main]`'s, a `LocalSet`), one per process or more.
pub struct Worker {
    pool: PgPool,
    handlers: HashMap<String, Entry>,
    lease: Duration,
    concurrency: usize,
    poll: Duration,
    drain: Duration,
    owner: String,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("names", &self.handlers.keys().collect::<Vec<_>>())
            .field("lease", &self.lease)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

/// One claimed call with its lease.
struct Claimed {
    call: Call,
    lease: i64,
    started: bool,
    left: Duration,
}

impl Worker {
    /// A worker on `pool` with no handler yet. Defaults: a lease of 10 s
    /// (renewed every third of it), 32 calls at once, a poll every 100 ms
    /// when nothing is due, 5 s to finish what runs at shutdown.
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            handlers: HashMap::new(),
            lease: Duration::from_secs(10),
            concurrency: 32,
            poll: Duration::from_millis(100),
            drain: Duration::from_secs(5),
            owner: format!("{}:{}", std::process::id(), IdempotencyKey::random()),
        }
    }

    /// Run `handler` for the calls enqueued as `name`.
    #[must_use]
    pub fn handle(mut self, name: &str, handler: Handler) -> Self {
        let label = label(name);
        let engine_name = retries_core::door::call_name(label, &DURABLE);
        self.handlers.insert(
            name.to_owned(),
            Entry {
                handler,
                label,
                engine_name,
            },
        );
        self
    }

    /// The lease a claim takes (renewed every third of it while the call
    /// runs): after a crash, the call waits this long at most before
    /// another worker claims it.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How many calls run at once.
    #[must_use]
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// The pause between claims when nothing is due.
    #[must_use]
    pub fn poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// How long calls still running at shutdown are given to end (then
    /// dropped: an attempt cut there is an unknown outcome for the next
    /// worker, never sent blindly).
    #[must_use]
    pub fn drain(mut self, drain: Duration) -> Self {
        self.drain = drain;
        self
    }

    /// Claim and drive calls until `shutdown` completes; then stop claiming
    /// and give what runs [`drain`](Self::drain) to end.
    ///
    /// # Errors
    ///
    /// A worker without handlers, or with a zero lease or concurrency. A
    /// database that fails is waited out (each poll tries again), never an
    /// error.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), WorkerError> {
        if self.handlers.is_empty() {
            return Err(WorkerError::NoHandler);
        }
        if self.lease.is_zero() {
            return Err(WorkerError::Zero("lease"));
        }
        if self.concurrency == 0 {
            return Err(WorkerError::Zero("concurrency"));
        }
        let names: Vec<String> = self.handlers.keys().cloned().collect();
        let mut shutdown = std::pin::pin!(shutdown);
        let writes = Writes::default();
        let mut in_flight = FuturesUnordered::new();
        let mut claiming: Option<Local<'_, Result<Vec<Claimed>, sqlx_core::Error>>> = None;
        let mut asked = 0;
        let mut next_claim = tokio::time::Instant::now();
        let mut next_sweep = tokio::time::Instant::now();
        let mut sweeping: Option<Local<'_, ()>> = None;
        let mut batcher = std::pin::pin!(writes.run(&self.pool));
        loop {
            // Claims in batches: a claim of one call per call that ends
            // would cost a round trip each.
            let room = self.concurrency - in_flight.len();
            let room = if room * 2 >= self.concurrency || in_flight.is_empty() {
                room
            } else {
                0
            };
            if claiming.is_none() && room > 0 && tokio::time::Instant::now() >= next_claim {
                asked = room;
                claiming = Some(Box::pin(self.claim(&names, room)));
            }
            if sweeping.is_none() && tokio::time::Instant::now() >= next_sweep {
                next_sweep = tokio::time::Instant::now() + Duration::from_secs(1);
                sweeping = Some(Box::pin(self.sweep()));
            }
            // The next moment a claim or a sweep is to start, if one is
            // to: what runs meanwhile is polled (a statement of theirs
            // holds a pooled connection until its answer is read).
            let wake = [
                (claiming.is_none() && room > 0).then_some(next_claim),
                sweeping.is_none().then_some(next_sweep),
            ]
            .into_iter()
            .flatten()
            .min();
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                () = &mut batcher => {}
                Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
                claimed = async {
                    match claiming.as_mut() {
                        Some(claim) => claim.await,
                        None => std::future::pending().await,
                    }
                }, if claiming.is_some() => {
                    claiming = None;
                    match claimed {
                        Ok(calls) => {
                            // A full batch: more may be due at once.
                            next_claim = tokio::time::Instant::now()
                                + if calls.len() == asked { Duration::ZERO } else { self.poll };
                            for c in calls {
                                in_flight.push(self.drive(c, &writes));
                            }
                        }
                        Err(e) => {
                            next_claim = tokio::time::Instant::now() + self.poll;
                            observe::event(Level::Debug, "durable", "claim failed; tried again at the next poll", &e);
                        }
                    }
                }
                () = async {
                    match sweeping.as_mut() {
                        Some(sweep) => sweep.await,
                        None => std::future::pending().await,
                    }
                }, if sweeping.is_some() => sweeping = None,
                () = tokio::time::sleep_until(wake.unwrap_or(next_sweep)), if wake.is_some() => {}
            }
        }
        drop((claiming, sweeping));
        let _ = tokio::time::timeout(self.drain, async {
            tokio::select! {
                () = async { while in_flight.next().await.is_some() {} } => {}
                () = &mut batcher => {}
            }
        })
        .await;
        Ok(())
    }

    /// A name's metric label: its handler's, interned once; a name no
    /// handler serves (the sweep's) is interned on the spot.
    fn label_of(&self, name: &str) -> &'static str {
        self.handlers
            .get(name)
            .map_or_else(|| label(name), |e| e.label)
    }

    async fn claim(&self, names: &[String], n: usize) -> Result<Vec<Claimed>, sqlx_core::Error> {
        type Row = (
            i64,
            String,
            String,
            Vec<u8>,
            i64,
            i32,
            bool,
            i64,
            i64,
            Option<String>,
        );
        let rows: Vec<Row> = sqlx_core::query_as::query_as(sql::CLAIM)
            .bind(names)
            .bind(&self.owner)
            .bind(millis(self.lease))
            .bind(i64::try_from(n).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await?;
        // The oldest due age of each name claimed (a claim takes few names).
        let mut oldest: Vec<(&'static str, Duration)> = Vec::new();
        let claimed = rows
            .into_iter()
            .filter_map(
                |(id, name, key, payload, lease, attempts, started, left, age, trace)| {
                    let age = Duration::from_millis(u64::try_from(age).unwrap_or(0));
                    let tag = self.label_of(&name);
                    match oldest.iter_mut().find(|(l, _)| *l == tag) {
                        Some((_, o)) => *o = (*o).max(age),
                        None => oldest.push((tag, age)),
                    }
                    let Ok(key) = key.parse() else {
                        // Written by something else than `enqueue`: never a key
                        // this door made. Left to its deadline's sweep.
                        observe::event(
                            Level::Warn,
                            "durable",
                            "a call whose key is not 32 hex digits is left alone",
                            &id,
                        );
                        return None;
                    };
                    Some(Claimed {
                        call: Call {
                            id,
                            name,
                            key,
                            payload,
                            attempts: u32::try_from(attempts).unwrap_or(0),
                            trace,
                        },
                        lease,
                        started,
                        left: Duration::from_millis(u64::try_from(left).unwrap_or(0)),
                    })
                },
            )
            .collect();
        for (label, age) in oldest {
            observe::seconds("retry.durable.oldest_due_age", &[("name", label)], age);
        }
        Ok(claimed)
    }

    /// Calls past their deadline that no worker holds: dead.
    async fn sweep(&self) {
        let swept: Result<Vec<(String, String, String)>, _> =
            sqlx_core::query_as::query_as(sql::SWEEP)
                .fetch_all(&self.pool)
                .await;
        for (name, key, reason) in swept.unwrap_or_default() {
            let label = self.label_of(&name);
            count(
                "retry.durable.dead",
                label,
                Some(if reason == "unknown_outcome" {
                    "unknown_outcome"
                } else {
                    "deadline_exceeded"
                }),
            );
            observe::event(
                Level::Warn,
                "durable",
                "a durable call is dead",
                &format_args!("name={name} key={key} reason={reason}"),
            );
        }
    }

    /// One claimed call, to its end or until its lease is lost.
    async fn drive(&self, c: Claimed, writes: &Writes) {
        let entry = &self.handlers[&c.call.name];
        // The claim's span: the engine's attempt spans nest in it, and it
        // names the enqueuing transaction's trace (see `Call::trace`).
        let span = tracing::debug_span!(
            target: "retries_sqlx::durable",
            "durable call",
            name = %c.call.name,
            key = %c.call.key,
            earlier_attempts = c.call.attempts,
            enqueued_trace = c.call.trace.as_deref().unwrap_or(""),
        );
        super::link::link(&span, c.call.trace.as_deref());
        let renew = async {
            let every = self.lease / 3;
            let mut renewed = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(every).await;
                let r = sqlx_core::query::query(sql::RENEW)
                    .bind(c.call.id)
                    .bind(c.lease)
                    .bind(millis(self.lease))
                    .execute(&self.pool)
                    .await;
                match r {
                    Ok(done) if done.rows_affected() == 1 => renewed = tokio::time::Instant::now(),
                    // The database is away: go on while the lease may hold.
                    Err(_) if renewed.elapsed() < self.lease.saturating_sub(every) => {}
                    // Taken over (another worker owns it now), or the
                    // lease may have lapsed.
                    Ok(_) | Err(_) => return,
                }
            }
        };
        tokio::select! {
            biased;
            () = self.settle(entry, &c, writes).instrument(span) => {}
            () = renew => observe::event(
                Level::Warn,
                "durable",
                "a durable call's lease was lost; the call is left to the worker that takes it",
                &format_args!("name={} key={}", c.call.name, c.call.key),
            ),
        }
    }

    #[allow(clippy::too_many_lines)] // one call's whole path, in order
    async fn settle(&self, entry: &Entry, c: &Claimed, writes: &Writes) {
        let h = &entry.handler;
        let (pool, id, lease) = (&self.pool, c.call.id, c.lease);
        // Whether the table says an attempt started whose outcome is not
        // known, and the attempts column as this worker last wrote it.
        let started = Cell::new(c.started);
        let attempts = Cell::new(i32::try_from(c.call.attempts).unwrap_or(i32::MAX));
        let cut_first = c.started && !h.idempotent;
        let bound = retries_core::door::add(retries_core::door::now(), c.left);
        let paused = {
            let pool = pool.clone();
            let attempts = &attempts;
            move |ev: &RetryEvent<'_, HandlerError>| {
                let (pool, n) = (pool.clone(), attempts.get());
                let (delay, error) = (millis(ev.delay()), ev.error().map(ToString::to_string));
                count("retry.durable.retried", entry.label, None);
                // Not awaited by the engine's pause: a write that lands
                // after the next attempt started matches no row.
                tokio::spawn(async move {
                    let _ = sqlx_core::query::query(sql::PAUSE)
                        .bind(id)
                        .bind(lease)
                        .bind(n)
                        .bind(delay)
                        .bind(error)
                        .execute(&pool)
                        .await;
                });
            }
        };
        let spec = retries_core::call(&h.policy)
            .name(entry.engine_name)
            .idempotent_if(h.idempotent)
            .budget(&*h.budget)
            .breaker(h.breaker.as_deref())
            .on_retry(paused);
        let body = async |at: &Attempt| -> Result<(), HandlerError> {
            if cut_first && at.number() == 1 {
                return Err(HandlerError::cut());
            }
            let marked = writes.write(Kind::Start, id, lease).await.map_err(|e| {
                HandlerError::new(
                    Verdict::not_executed(),
                    format!("the attempt could not be marked started: {e}"),
                )
            })?;
            if !marked {
                return Err(HandlerError::fenced());
            }
            started.set(true);
            attempts.set(attempts.get().saturating_add(1));
            let out = caught((h.run)(&c.call, at)).await;
            if let Err(e) = &out
                && e.verdict.kind() == retries_core::VerdictKind::NotExecuted
            {
                let cleared = sqlx_core::query::query(sql::NOT_RUN)
                    .bind(id)
                    .bind(lease)
                    .bind(&e.message)
                    .execute(pool)
                    .await;
                if cleared.is_ok_and(|r| r.rows_affected() == 1) {
                    started.set(false);
                }
            }
            out
        };
        let out: Result<(), Failure<HandlerError>> = match &h.reconcile {
            Some(r) => {
                let spec = spec.reconcile(async |_: IdempotencyKey| {
                    caught(r(&c.call)).await.map(|done| done.then_some(()))
                });
                retries_core::door::door_loop!(spec, Some(bound), key: Some(c.call.key), Result<(), HandlerError>, |at| body(at))
            }
            None => {
                retries_core::door::door_loop!(spec, Some(bound), key: Some(c.call.key), Result<(), HandlerError>, |at| body(at))
            }
        };
        let failure = match out {
            Ok(()) => {
                if writes.write(Kind::Done, id, lease).await == Ok(true) {
                    count("retry.durable.done", entry.label, None);
                }
                return;
            }
            Err(f) => f,
        };
        if failure.last_error().is_some_and(|e| e.fenced) {
            return;
        }
        let error = failure.last_error().map(ToString::to_string);
        let error = &error;
        let left = bound.saturating_duration_since(retries_core::door::now());
        let unresolved = started.get() && !h.idempotent;
        let dead = |reason: Reason| async move {
            let reason = if reason == Reason::DeadlineExceeded && unresolved {
                Reason::UnknownOutcome
            } else {
                reason
            };
            let written = sqlx_core::query::query(sql::DEAD)
                .bind(id)
                .bind(lease)
                .bind(reason.as_str())
                .bind(error)
                .execute(pool)
                .await
                .is_ok_and(|r| r.rows_affected() == 1);
            if written {
                count("retry.durable.dead", entry.label, Some(reason.as_str()));
                observe::event(
                    Level::Warn,
                    "durable",
                    "a durable call is dead",
                    &format_args!(
                        "name={} key={} reason={} error={}",
                        c.call.name,
                        c.call.key,
                        reason.as_str(),
                        error.as_deref().unwrap_or("none")
                    ),
                );
            }
        };
        let later = |delay: Duration| async move {
            let written = sqlx_core::query::query(sql::LATER)
                .bind(id)
                .bind(lease)
                .bind(millis(delay))
                .bind(error)
                .execute(pool)
                .await
                .is_ok_and(|r| r.rows_affected() == 1);
            if written {
                count("retry.durable.retried", entry.label, None);
            }
        };
        match failure.reason() {
            Reason::Permanent => dead(Reason::Permanent).await,
            Reason::UnknownOutcome => dead(Reason::UnknownOutcome).await,
            // Not sent (or not sent again) for the client's own limits:
            // back in a second, the table's mark as it stands.
            Reason::CircuitOpen
            | Reason::RateLimited
            | Reason::OverQuota
            | Reason::Saturated
            | Reason::Throttled
            | Reason::BudgetExhausted
                if left > Duration::from_secs(1) =>
            {
                later(Duration::from_secs(1)).await;
            }
            _ if left > h.policy.min_attempt() => {
                // The claim's loop is spent, not the call: back in the
                // queue, later with each claim.
                let claims = u32::try_from(lease.clamp(1, 20)).unwrap_or(20);
                let delay = Duration::from_secs(1)
                    .saturating_mul(1 << (claims - 1))
                    .min(Duration::from_mins(5))
                    .min(left);
                later(delay).await;
            }
            reason => {
                let reason = match reason {
                    Reason::Exhausted | Reason::PauseExceedsDeadline => Reason::DeadlineExceeded,
                    other => other,
                };
                dead(reason).await;
            }
        }
    }
}

/// The most handler names the counters carry; others are counted as
/// `other` (a name comes from the enqueuing side, which may not be bounded).
const NAMES: usize = 256;

/// `name` kept for the process, to label metrics with: at most [`NAMES`]
/// of them, `other` after (a name comes from the enqueuing side, which
/// may not be bounded). Looked up once per handler, and once per enqueue.
pub(super) fn label(name: &str) -> &'static str {
    static KNOWN: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut known = KNOWN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match known.iter().find(|k| **k == name) {
        Some(k) => k,
        None if known.len() < NAMES => {
            let k: &'static str = Box::leak(name.to_owned().into_boxed_str());
            known.push(k);
            k
        }
        None => "other",
    }
}

/// A counter of the durable door, by name (and reason).
pub(super) fn count(metric: &'static str, label: &'static str, reason: Option<&'static str>) {
    match reason {
        Some(reason) => observe::counter(metric, &[("name", label), ("reason", reason)]),
        None => observe::counter(metric, &[("name", label)]),
    }
}

/// `fut`, with a panic while it is polled caught as an unknown outcome (it
/// may have done part of its work).
async fn caught<T>(fut: Local<'_, Result<T, HandlerError>>) -> Result<T, HandlerError> {
    let mut fut = fut;
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(p) => p,
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".to_owned());
                std::task::Poll::Ready(Err(HandlerError::new(
                    Verdict::unknown(),
                    format!("the handler panicked: {message}"),
                )))
            }
        }
    })
    .await
}
