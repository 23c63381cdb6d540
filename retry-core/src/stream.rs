//! Streams that resume without duplicates (feature `stream`): a retry of a
//! stream is a new call from the last delivered cursor, never a continuation
//! from the middle.
//!
//! [`Retry::resume`](crate::Retry::resume) takes `open`, a function that
//! opens the stream from an optional cursor, and `cursor_of`, which reads an
//! item's cursor (an offset, a sequence number, an event id: any `Ord +
//! Clone`). The [`Resume`] stream it returns delivers every item once, in
//! order, across failures.
//!
//! # Which cursor, what is skipped, what is an error
//!
//! * The stream opens with `open(None)`, or `open(Some(c))` after
//!   [`Resume::after`]`(c)`. Every reopen is `open(Some(last))`, where `last`
//!   is the cursor of the last item **delivered to the consumer** (returned
//!   by `poll_next`), never one read but not yet delivered.
//! * A reopened connection may repeat items: those at or before `last`
//!   (`cursor <= last`) that it sends **before its first new item** are
//!   skipped, not delivered, and counted.
//! * Once a connection has delivered an item, its cursors must increase: an
//!   item at or before the last delivered one ends the stream with
//!   [`Error::Rewound`], not a silent rewind or a duplicate.
//!
//! # Calls, attempts, deadlines
//!
//! The stream runs on the same engine as every retried call. A **call** is
//! "get the stream to its next new item": its attempts are connections. The
//! first call opens the stream; it succeeds at the first item delivered, and
//! the stream goes on. When a connection that delivered fails later, a new
//! call starts then, with that connection as its first attempt: the failure
//! is classified ([`Classify`](crate::Classify), or the call's `classify`), a
//! permanent error ends the stream with it, a transient one reopens after
//! the policy's backoff, within the budget, for at most `max_attempts`
//! connections without a new item, and within the policy's deadline
//! counted from the failure. A stream that keeps making progress is never
//! stopped by attempts or the per-call deadline; the budget still counts
//! every reopen.
//!
//! * The policy's `attempt_timeout` bounds a connection's open **and** its
//!   first new item (cut off: outcome unknown, reopened).
//! * [`Resume::idle`] bounds the wait for each later item: a connection that
//!   goes silent that long is dropped and reopened from the cursor.
//! * [`Resume::deadline`] bounds the whole stream (none by default): no
//!   attempt or pause goes past it, and when it passes the stream ends with
//!   [`Reason::DeadlineExceeded`](crate::Reason::DeadlineExceeded).
//! * The breaker admits every connection and counts a connection that
//!   delivers nothing as a transient failure; a connection that delivered
//!   and then broke is not held against it.
//!
//! A stream takes no [concurrency](crate::limit) slot: `resume` is not
//! offered after [`Retry::concurrency`](crate::Retry::concurrency) (a slot
//! held for a stream's whole life is not what a limit on calls means).
//!
//! An error ends the stream: the next poll returns `None`. A stream that
//! ends cleanly (`None` from the connection) is complete. Dropping the
//! [`Resume`] drops the connection and any pause. A stream is not an
//! attempt of an enclosing call: its open runs outside the retry scope, so
//! calls it makes neither defer to nor inherit the deadline of a call around
//! it.
//!
//! # Observability
//!
//! Metrics (label `function`): `retry.stream.delivered`,
//! `retry.stream.skipped`, `retry.stream.reopened` (counters), beside the
//! per-call instruments of [`observe`](crate::observe). Tracing (target
//! `retries`): DEBUG `stream reopened` (`cursor` present or not,
//! `delivered`, `skipped`, `reopens`) and `item skipped`, DEBUG `stream
//! ended` with the totals, WARN `stream rewound`; a stream that stops is the
//! WARN `call failed` of its last call.
//!
//! ```
//! use std::time::Duration;
//! use futures_util::StreamExt;
//! use retries::{Attempt, Policy};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // A source that breaks after every third event, and replays one event
//! // on every reopen.
//! let policy = Policy::new(Duration::from_secs(2));
//! let events = retries::call(&policy).idempotent().resume(
//!     |from: Option<u64>| async move {
//!         let start = from.unwrap_or(0); // replays `from` itself
//!         let items = (start..10).take(4).map(Ok).chain(std::iter::once(Err(
//!             std::io::Error::from(std::io::ErrorKind::ConnectionReset),
//!         )));
//!         Ok::<_, std::io::Error>(futures_util::stream::iter(items))
//!     },
//!     |n: &u64| *n,
//! );
//! let got: Vec<u64> = events.map(|r| r.unwrap()).take(10).collect().await;
//! assert_eq!(got, (0..10).collect::<Vec<_>>());
//! # }
//! ```
//!
//! # Sending: a bounded outbox
//!
//! The other half of a stream's backpressure is the sending side: a slow
//! receiver must not make the sender queue without limit. [`outbox`] gives a
//! [`Sender`] and a [`Receiver`] (a `Stream`, ready to be a tonic
//! server-streaming response) around a queue of fixed capacity, with an
//! [`Overflow`] rule chosen by the data: wait (bounded), reject, drop the
//! oldest, drop the newest; every drop and refusal counted
//! ([`OutboxStats`]). See [`outbox`](crate::stream::outbox()) for the table.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_core::Stream;

use crate::attempt::Limit;
use crate::attempt::{Attempt, add};
use crate::breaker::Breaker;
use crate::budget::Budget;
use crate::engine::{Engine, Outcome, Step, Timer};
use crate::failure::Failure;
pub use crate::observe::Counts;
use crate::observe::StreamObserver;
pub use crate::outbox::{OutboxError, OutboxStats, Overflow, Receiver, SendError, Sender, outbox};
use crate::spec::slots::{Classifier, Idempotent, NoLimit, NoReconcile, NoRetryIf, OnRetry};
use crate::spec::{Retry, SlotSet};

/// How a resumed stream ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error<E, Cur> {
    /// A call of the stream stopped (see [`Failure::reason`]): a permanent
    /// error, attempts without a new item exhausted, the deadline, the
    /// budget, the breaker.
    #[error("stream stopped: {0}")]
    Stopped(Failure<E>),
    /// A connection went back after delivering: an item at or before the
    /// last delivered cursor (`got <= last`).
    #[error("stream rewound: an item at {got:?} after {last:?} was delivered")]
    Rewound {
        /// The cursor of the last item delivered.
        last: Cur,
        /// The cursor of the item that went back.
        got: Cur,
    },
}

impl<E, Cur> Error<E, Cur> {
    /// The call's failure, when a call stopped.
    #[must_use]
    pub fn failure(&self) -> Option<&Failure<E>> {
        match self {
            Self::Stopped(f) => Some(f),
            Self::Rewound { .. } => None,
        }
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<Fut, S> {
        // Open a connection (the first or a reopen).
        Start,
        // Waiting for `open`.
        Opening { #[pin] fut: Fut },
        // Reading items.
        Streaming { #[pin] stream: S },
        // A pause before the next connection (the timer is armed).
        Paused,
        // Ended: by the source, by an error, or by a stop.
        Done,
    }
}

// A stream takes no concurrency slot (`resume` is not offered after
// `concurrency`: a slot held for a stream's whole life is not what a limit on
// calls means).
type StreamEngine<'a, E, C, H, B, K> =
    Engine<'a, E, Idempotent, C, NoReconcile, H, B, K, NoRetryIf, NoLimit>;

pin_project_lite::pin_project! {
    /// A stream that resumes from its last delivered cursor; made by
    /// [`Retry::resume`](crate::Retry::resume). See the [module docs](self).
    #[must_use = "streams do nothing unless polled"]
    pub struct Resume<'a, E, C, H, B, K: Breaker, Op, CurOf, Cur, Fut, S> {
        engine: StreamEngine<'a, E, C, H, B, K>,
        open: Op,
        cursor_of: CurOf,
        // The cursor of the last item delivered (or given to `after`).
        last: Option<Cur>,
        idle: Option<Duration>,
        whole: Option<Duration>,
        started: bool,
        // The bound of every call of the stream (the whole stream's limit,
        // the enclosing scope's deadline), fixed when it starts.
        cap: Option<Instant>,
        // A call's attempt is in progress (a connection not yet past its
        // first new item; its context is the engine's); `false` once the
        // call succeeded.
        in_attempt: bool,
        // The timer is armed for the current phase.
        armed: bool,
        // Until when the current connection may stay silent, after its call.
        idle_until: Option<(Instant, Limit)>,
        // This connection delivered an item.
        delivered_here: bool,
        counts: Counts,
        observe: StreamObserver,
        #[pin]
        timer: Timer,
        #[pin]
        state: State<Fut, S>,
    }
}

impl<'a, Sl> Retry<'a, Sl>
where
    Sl: SlotSet<I = Idempotent, R = NoReconcile, O = NoRetryIf, L = NoLimit>,
    Sl::B: Budget,
    Sl::K: Breaker,
{
    /// A stream opened by `open(cursor)` that resumes, after a failure, from
    /// the cursor (`cursor_of(&item)`) of the last item delivered; see the
    /// [`stream`](crate::stream) module for the rules. Reading a stream from
    /// a cursor is repeatable, so only an idempotent call resumes.
    #[allow(clippy::type_complexity)] // the stream's type names the slots it keeps
    pub fn resume<E, T, Cur, Op, Fut, S, CurOf>(
        self,
        open: Op,
        cursor_of: CurOf,
    ) -> Resume<'a, E, Sl::C, Sl::H, Sl::B, Sl::K, Op, CurOf, Cur, Fut, S>
    where
        Op: FnMut(Option<Cur>) -> Fut,
        Fut: Future<Output = Result<S, E>>,
        S: Stream<Item = Result<T, E>>,
        CurOf: Fn(&T) -> Cur,
        Cur: Ord + Clone,
        Sl::C: Classifier<E>,
        Sl::H: OnRetry<E>,
    {
        let observe = StreamObserver::new(self.head.name);
        Resume {
            // Not under the scope it is made in: a stream is not an attempt
            // of a call around it (see the module docs), and is often
            // returned from one and read long after it ended.
            engine: crate::scope::leave(|| Engine::new(self.into_spec())),
            open,
            cursor_of,
            last: None,
            idle: None,
            whole: None,
            started: false,
            cap: None,
            in_attempt: false,
            armed: false,
            idle_until: None,
            delivered_here: false,
            counts: Counts::default(),
            observe,
            timer: Timer::new(),
            state: State::Start,
        }
    }
}

impl<E, C, H, B, K: Breaker, Op, CurOf, Cur, Fut, S>
    Resume<'_, E, C, H, B, K, Op, CurOf, Cur, Fut, S>
{
    /// Start after `cursor` (a position saved earlier): the first open is
    /// `open(Some(cursor))`, and items at or before it are skipped.
    pub fn after(mut self, cursor: Cur) -> Self {
        self.last = Some(cursor);
        self
    }

    /// Cut off and reopen a connection that sends no item for `limit` after
    /// its last one. Default: none.
    pub fn idle(mut self, limit: Duration) -> Self {
        self.idle = Some(limit);
        self
    }

    /// Bound the whole stream by `limit` from its first poll. Default: none.
    pub fn deadline(mut self, limit: Duration) -> Self {
        self.whole = Some(limit);
        self
    }

    /// What has been delivered and skipped so far, and the reopens.
    #[must_use]
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// The cursor of the last item delivered.
    #[must_use]
    pub fn cursor(&self) -> Option<&Cur> {
        self.last.as_ref()
    }
}

impl<E, C, H, B, K, Op, CurOf, Cur, Fut, S, T> Stream
    for Resume<'_, E, C, H, B, K, Op, CurOf, Cur, Fut, S>
where
    C: Classifier<E>,
    H: OnRetry<E>,
    B: Budget,
    K: Breaker,
    Op: FnMut(Option<Cur>) -> Fut,
    Fut: Future<Output = Result<S, E>>,
    S: Stream<Item = Result<T, E>>,
    CurOf: Fn(&T) -> Cur,
    Cur: Ord + Clone + std::fmt::Debug,
{
    type Item = Result<T, Error<E, Cur>>;

    #[allow(clippy::too_many_lines)] // one state machine, read top to bottom
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        loop {
            let outcome: Outcome<(), E> = match this.state.as_mut().project() {
                StateProj::Done => return Poll::Ready(None),
                StateProj::Start => {
                    if !*this.started {
                        *this.started = true;
                        if let Some(w) = *this.whole {
                            this.engine.bound(add(crate::time::now(), w));
                        }
                        *this.cap = this.engine.cap();
                    }
                    if let Err(stop) = this.engine.admit() {
                        return ended(
                            this.state,
                            this.observe,
                            *this.counts,
                            Some(Err(Error::Stopped(stop))),
                        );
                    }
                    if this.counts.delivered > 0 || this.engine.attempts() > 1 {
                        this.counts.reopens += 1;
                        this.observe.reopened(this.last.is_some(), *this.counts);
                    }
                    let fut = (this.open)(this.last.clone());
                    *this.in_attempt = true;
                    *this.armed = false;
                    *this.idle_until = None;
                    *this.delivered_here = false;
                    this.state.set(State::Opening { fut });
                    continue;
                }
                StateProj::Opening { fut } => match fut.poll(cx) {
                    Poll::Ready(Ok(stream)) => {
                        this.state.set(State::Streaming { stream });
                        continue;
                    }
                    Poll::Ready(Err(e)) => Outcome::Done(Err(e)),
                    Poll::Pending => match cut_off(
                        &mut this.timer,
                        this.armed,
                        this.in_attempt.then(|| this.engine.attempt()),
                        *this.idle_until,
                        cx,
                    ) {
                        Some(limit) => Outcome::CutOff(limit),
                        None => return Poll::Pending,
                    },
                },
                StateProj::Streaming { stream } => match stream.poll_next(cx) {
                    Poll::Ready(Some(Ok(item))) => {
                        let cursor = (this.cursor_of)(&item);
                        if let Some(last) = this.last.as_ref()
                            && cursor <= *last
                        {
                            if *this.delivered_here {
                                let last = last.clone();
                                this.state.set(State::Done);
                                this.observe.rewound(*this.counts);
                                return Poll::Ready(Some(Err(Error::Rewound {
                                    last,
                                    got: cursor,
                                })));
                            }
                            this.counts.skipped += 1;
                            this.observe.skipped();
                            continue;
                        }
                        *this.last = Some(cursor);
                        *this.delivered_here = true;
                        if std::mem::take(this.in_attempt) {
                            // The call's first new item: it succeeded.
                            let _ = this.engine.settle(Outcome::Done(Ok::<(), E>(())));
                        }
                        // The next item is awaited within the idle limit
                        // and the whole stream's deadline.
                        // (The clock is read only with an idle limit.)
                        let idle = this
                            .idle
                            .map(|d| (add(crate::time::now(), d), Limit::Attempt));
                        let whole = this.cap.map(|c| (c, Limit::Call));
                        *this.idle_until = match (idle, whole) {
                            (Some(i), Some(w)) => Some(if w.0 <= i.0 { w } else { i }),
                            (i, w) => i.or(w),
                        };
                        *this.armed = false;
                        this.counts.delivered += 1;
                        this.observe.delivered();
                        return Poll::Ready(Some(Ok(item)));
                    }
                    Poll::Ready(Some(Err(e))) => Outcome::Done(Err(e)),
                    Poll::Ready(None) => {
                        if std::mem::take(this.in_attempt) {
                            let _ = this.engine.settle(Outcome::Done(Ok::<(), E>(())));
                        }
                        return ended(this.state, this.observe, *this.counts, None);
                    }
                    Poll::Pending => match cut_off(
                        &mut this.timer,
                        this.armed,
                        this.in_attempt.then(|| this.engine.attempt()),
                        *this.idle_until,
                        cx,
                    ) {
                        Some(limit) => Outcome::CutOff(limit),
                        None => return Poll::Pending,
                    },
                },
                StateProj::Paused => {
                    if this.timer.as_mut().poll_fired(cx).is_pending() {
                        return Poll::Pending;
                    }
                    this.state.set(State::Start);
                    continue;
                }
            };
            // A connection failed: the engine settles it (a new call if it
            // had delivered).
            this.state.set(State::Start);
            let next = if std::mem::take(this.in_attempt) {
                this.engine.settle(outcome)
            } else {
                this.engine.restart(outcome, *this.cap)
            };
            match next {
                Step::Retry(None) => {}
                Step::Retry(Some(until)) => {
                    this.timer.as_mut().arm(until);
                    this.state.set(State::Paused);
                }
                Step::Done(Err(stop)) => {
                    return ended(
                        this.state,
                        this.observe,
                        *this.counts,
                        Some(Err(Error::Stopped(stop))),
                    );
                }
                // A failed connection is never a success, and an idempotent
                // call without `reconcile` never looks anything up.
                Step::Done(Ok(())) | Step::Reconcile(..) => {
                    return ended(this.state, this.observe, *this.counts, None);
                }
            }
        }
    }
}

/// The stream is over: nothing more is polled; `last` is its last item (an
/// error) or `None` (it ended).
fn ended<Fut, S, I>(
    mut state: Pin<&mut State<Fut, S>>,
    observe: &StreamObserver,
    counts: Counts,
    last: Option<I>,
) -> Poll<Option<I>> {
    state.set(State::Done);
    observe.ended(counts);
    Poll::Ready(last)
}

/// The time limit of the current phase, armed on the first `Pending`: the
/// attempt's (open and first new item) while its call is in progress, the
/// idle limit after. `Some(limit)` when it has passed.
fn cut_off(
    timer: &mut Pin<&mut Timer>,
    armed: &mut bool,
    at: Option<&Attempt>,
    idle_until: Option<(Instant, Limit)>,
    cx: &mut Context<'_>,
) -> Option<Limit> {
    let (until, limit) = match at {
        Some(at) => {
            let timing = at.timing();
            (timing.deadline, timing.limit())
        }
        None => idle_until?,
    };
    crate::engine::cut_off(timer.as_mut(), armed, until, limit, cx)
}
