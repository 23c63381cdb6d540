//! The bounded sender of `retries::stream` (see `outbox`).

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
#[cfg(not(loom))]
use std::sync::{Mutex, MutexGuard};

// The books are `loom`'s in the model-checking build (`loom_models.rs`).
#[cfg(loom)]
use loom::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::Notify;

/// What a send does when the queue is full (see [`outbox`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// Wait for room at most this long (and never past the deadline of the
    /// retried call the send runs in), then fail with the item.
    Wait(Duration),
    /// Fail at once with the item.
    Reject,
    /// Drop the oldest queued item to make room.
    DropOldest,
    /// Drop the new item.
    DropNewest,
}

impl Overflow {
    fn as_str(self) -> &'static str {
        match self {
            Self::Wait(_) => "wait",
            Self::Reject => "reject",
            Self::DropOldest => "drop_oldest",
            Self::DropNewest => "drop_newest",
        }
    }
}

/// A bad setting for [`outbox`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// A capacity of zero: nothing could ever be sent.
    #[error("an outbox needs a capacity of at least 1")]
    ZeroCapacity,
}

/// A send that did not queue its item; the item is handed back.
#[derive(PartialEq, Eq)]
pub enum SendError<T> {
    /// The queue was full (`Reject`), or stayed full for the whole wait
    /// (`Wait`, its bound or the call's deadline).
    Full(T),
    /// The receiver is gone.
    Closed(T),
}

impl<T> SendError<T> {
    /// The item that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            Self::Full(t) | Self::Closed(t) => t,
        }
    }
}

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Full(_) => "Full(..)",
            Self::Closed(_) => "Closed(..)",
        })
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Full(_) => "the outbox is full",
            Self::Closed(_) => "the outbox's receiver is gone",
        })
    }
}

impl<T> std::error::Error for SendError<T> {}

/// What an outbox has seen so far ([`Sender::stats`]). Every item given to
/// a send is exactly one of: received, still queued, dropped, refused (a
/// send cancelled before it returned counts its item as dropped).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxStats {
    /// Items queued by a send (dropped ones included, if dropped later by
    /// `DropOldest`).
    pub queued: u64,
    /// Items the receiver took.
    pub received: u64,
    /// Items dropped: the oldest (`DropOldest`), the new one (`DropNewest`),
    /// or the item of a send cancelled before it returned.
    pub dropped: u64,
    /// Sends that failed with the item handed back (full, or closed).
    pub refused: u64,
    /// Items in the queue when the stats were read.
    pub len: usize,
    /// The most items the queue ever held (never above the capacity).
    pub max_len: usize,
}

struct State<T> {
    queue: VecDeque<T>,
    senders: usize,
    receiver_gone: bool,
    receiver: Option<Waker>,
    stats: OutboxStats,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Room was made, or the receiver went away.
    room: Notify,
    overflow: Overflow,
    capacity: usize,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic while the lock was held left the queue consistent (every
        // change is one push or pop): go on with it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn stats(&self) -> OutboxStats {
        let state = self.lock();
        OutboxStats {
            len: state.queue.len(),
            ..state.stats
        }
    }
}

/// A bounded sender for streams: `outbox` makes a [`Sender`] and a
/// [`Receiver`] (a `Stream`) around a queue of fixed capacity, and what a
/// send does when the queue is full is chosen by the data ([`Overflow`]):
///
/// | rule | when full | for |
/// |---|---|---|
/// | [`Overflow::Wait`] | the send waits for room, at most the bound and never past the deadline of the retried call it runs in; then it fails with the item handed back | data that must all arrive in order (orders, a ledger) |
/// | [`Overflow::Reject`] | the send fails at once, the item handed back | a request stream whose producer can slow down or answer "busy" |
/// | [`Overflow::DropOldest`] | the oldest queued item is dropped for the new one | state where only the newest matters (positions, gauges) |
/// | [`Overflow::DropNewest`] | the new item is dropped | samples, telemetry |
///
/// A dropped item is never silent: it is counted ([`Sender::stats`]), each
/// drop is a DEBUG event (target `retries`) and the counter
/// `retry.stream.outbox.dropped` (label `rule`); a refused send (a full
/// `Reject`, a `Wait` that ran out of time) is counted as `refused` and
/// `retry.stream.outbox.refused`.
///
/// Memory is bounded by the capacity: the queue is allocated once, at its
/// capacity, and never grows; a send allocates nothing beyond the item. A
/// slow receiver therefore costs the sender at most `capacity` items, not an
/// unbounded queue (what an unbounded channel behind a tonic
/// server-streaming handler does to a slow client).
///
/// It plugs into tonic as it is: a server-streaming handler returns the
/// [`Receiver`] of `Result<T, Status>` as its response stream, and a
/// client-streaming call sends one as its request.
///
/// ```
/// use std::time::Duration;
/// use futures_util::StreamExt;
/// use retries::stream::{Overflow, outbox};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // Positions: only the newest matter, so a slow reader gets the latest.
/// let (tx, mut rx) = outbox::<u32>(2, Overflow::DropOldest).unwrap();
/// for position in 1..=5 {
///     tx.send(position).await.unwrap();
/// }
/// drop(tx);
/// assert_eq!(rx.next().await, Some(4));
/// assert_eq!(rx.next().await, Some(5));
/// assert_eq!(rx.next().await, None);
/// # }
/// ```
///
/// Cancel safety: a send dropped before it returned (never polled, or
/// waiting for room under `Wait`, by a timeout or a `select!`) leaves the
/// queue as it was; its item is dropped with it, never queued, and counted
/// as `dropped`, so the books still balance.
/// Dropping the receiver makes every send fail with the item handed back;
/// the stream ends once every sender is dropped and the queue is empty.
///
/// `outbox(capacity, overflow)` makes an outbox of `capacity` items whose
/// full queue follows `overflow`.
///
/// # Errors
///
/// [`OutboxError::ZeroCapacity`] for a capacity of zero.
pub fn outbox<T>(
    capacity: usize,
    overflow: Overflow,
) -> Result<(Sender<T>, Receiver<T>), OutboxError> {
    if capacity == 0 {
        return Err(OutboxError::ZeroCapacity);
    }
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::with_capacity(capacity),
            senders: 1,
            receiver_gone: false,
            receiver: None,
            stats: OutboxStats::default(),
        }),
        room: Notify::new(),
        overflow,
        capacity,
    });
    Ok((
        Sender {
            shared: Arc::clone(&shared),
        },
        Receiver { shared },
    ))
}

/// A send under way, until it returns: dropped earlier (the send was
/// cancelled), its item is counted as dropped.
struct Unsent<'a, T> {
    sender: &'a Sender<T>,
}

impl<T> Drop for Unsent<'_, T> {
    fn drop(&mut self) {
        self.sender.shared.lock().stats.dropped += 1;
        self.sender.count("dropped");
    }
}

/// The sending half of an [`outbox`]; clone it for more producers.
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Sender<T> {
    /// Queue `item`, or do what the outbox's [`Overflow`] says when it is
    /// full. `Ok` when the item was queued or dropped by the rule (counted);
    /// the item is handed back when it was refused.
    ///
    /// # Errors
    ///
    /// [`SendError::Full`] when the queue is full under `Reject`, or stayed
    /// full for a `Wait`'s whole bound (or until the deadline of the retried
    /// call the send runs in); [`SendError::Closed`] when the receiver is
    /// gone.
    pub fn send(&self, item: T) -> impl Future<Output = Result<(), SendError<T>>> + '_ {
        // Made before the first poll: a send dropped at any point before it
        // returns (never polled, or waiting for room) still counts its item.
        let unsent = Unsent { sender: self };
        async move {
            let done = self.send_or_wait(item).await;
            std::mem::forget(unsent);
            done
        }
    }

    async fn send_or_wait(&self, item: T) -> Result<(), SendError<T>> {
        let Overflow::Wait(bound) = self.shared.overflow else {
            return self.try_send(item);
        };
        let mut item = match self.push(item, false) {
            Err(SendError::Full(item)) => item,
            done => return done,
        };
        let mut until = crate::attempt::add(crate::time::now(), bound);
        if let Some(deadline) = crate::scope::deadline() {
            until = until.min(deadline);
        }
        let until = tokio::time::Instant::from_std(until);
        loop {
            let room = self.shared.room.notified();
            tokio::pin!(room);
            // Registered before the check: room made after it wakes us.
            room.as_mut().enable();
            item = match self.push(item, false) {
                Err(SendError::Full(item)) => item,
                done => return done,
            };
            if tokio::time::timeout_at(until, room).await.is_err() {
                // One last look (counted): room made as the time ran out.
                return self.push(item, true);
            }
        }
    }

    /// Queue `item` now, or do what the rule says without waiting (a full
    /// `Wait` outbox refuses at once, as `Reject` does).
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send), at once.
    pub fn try_send(&self, item: T) -> Result<(), SendError<T>> {
        self.push(item, true)
    }

    /// Queue `item`, or apply the rule; a full `Wait` outbox refuses,
    /// counted only when `count_full` (the wait's last look).
    fn push(&self, item: T, count_full: bool) -> Result<(), SendError<T>> {
        let mut state = self.shared.lock();
        if state.receiver_gone {
            state.stats.refused += 1;
            return Err(SendError::Closed(item));
        }
        let mut oldest = None;
        if state.queue.len() >= self.shared.capacity {
            match self.shared.overflow {
                Overflow::Wait(_) if !count_full => return Err(SendError::Full(item)),
                Overflow::Wait(_) | Overflow::Reject => {
                    state.stats.refused += 1;
                    drop(state);
                    self.count("refused");
                    return Err(SendError::Full(item));
                }
                Overflow::DropNewest => {
                    state.stats.dropped += 1;
                    drop(state);
                    self.count("dropped");
                    return Ok(());
                }
                Overflow::DropOldest => {
                    // Room for the new item, counted as dropped below.
                    oldest = state.queue.pop_front();
                    state.stats.dropped += 1;
                }
            }
        }
        state.queue.push_back(item);
        state.stats.queued += 1;
        state.stats.max_len = state.stats.max_len.max(state.queue.len());
        let waker = state.receiver.take();
        drop(state);
        if oldest.take().is_some() {
            self.count("dropped");
        }
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// What the outbox has seen so far.
    #[must_use]
    pub fn stats(&self) -> OutboxStats {
        self.shared.stats()
    }

    /// The outbox's capacity.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    #[cfg_attr(
        not(any(feature = "tracing", feature = "metrics")),
        allow(unused_variables)
    )]
    fn count(&self, what: &'static str) {
        let rule = self.shared.overflow.as_str();
        #[cfg(feature = "tracing")]
        tracing::debug!(target: "retries", rule, what, "outbox full");
        #[cfg(feature = "metrics")]
        {
            let name = if what == "dropped" {
                "retry.stream.outbox.dropped"
            } else {
                "retry.stream.outbox.refused"
            };
            metrics::counter!(name, "rule" => rule).increment(1);
        }
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.senders -= 1;
        let waker = (state.senders == 0)
            .then(|| state.receiver.take())
            .flatten();
        drop(state);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("overflow", &self.shared.overflow)
            .field("stats", &self.stats())
            .finish()
    }
}

/// The receiving half of an [`outbox`]: a `Stream` of the queued items, in
/// order; it ends when every [`Sender`] is gone and the queue is empty.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Receiver<T> {
    /// What the outbox has seen so far.
    #[must_use]
    pub fn stats(&self) -> OutboxStats {
        self.shared.stats()
    }
}

impl<T> Stream for Receiver<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut state = self.shared.lock();
        if let Some(item) = state.queue.pop_front() {
            state.stats.received += 1;
            drop(state);
            self.shared.room.notify_one();
            return Poll::Ready(Some(item));
        }
        if state.senders == 0 {
            return Poll::Ready(None);
        }
        if !state
            .receiver
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            state.receiver = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.shared.lock().queue.len(), None)
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.shared.lock().receiver_gone = true;
        // Every waiting send fails with its item.
        self.shared.room.notify_waiters();
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("overflow", &self.shared.overflow)
            .field("stats", &self.stats())
            .finish()
    }
}

/// The books under `loom` (CI: `--cfg loom`).
#[cfg(all(test, loom))]
mod loom_models;
