//! Backpressure: a [`Concurrency`] limit shared by calls, with bounded
//! waiting, and (feature `tower`) [`ShedLayer`], its server-side half.
//!
//! # The client side
//!
//! A [`Concurrency`] is a number of slots shared by every call given it (a
//! `static`, a field of a client, an `Arc`): `#[retryable(concurrency =
//! LIMIT)]`, [`Retry::concurrency`](crate::Retry::concurrency), or
//! [`RetryLayer::concurrency`](crate::tower::RetryLayer::concurrency). Before
//! its first attempt a call takes a slot:
//!
//! * a free slot is taken at once (no clock read, no allocation);
//! * otherwise the call queues, first come first served, for at most the
//!   limit's `max_wait`, and never past the point where its first attempt
//!   would no longer fit before the call's deadline (less `min_attempt`). The
//!   wait counts against the call's deadline;
//! * a call that gets no slot in that time stops at once with
//!   [`Reason::Saturated`](crate::Reason::Saturated): nothing was sent (its
//!   [`Stopped`](crate::Stopped) classifies as `NotExecuted`, so an outer
//!   loop knows the work did not run), no attempt was made, and its budget is
//!   neither charged nor credited for a failure.
//!
//! **A call keeps its slot for its whole life, retries and pauses included.**
//! Chosen over queuing again for every retry because a retry that joined the
//! back of the queue could be refused a slot after its first attempt already
//! had an effect, turning a recoverable failure into a stop; and because the
//! limit then bounds what it is meant to bound, the calls in progress against
//! the service, retry storms included (a retry never adds a caller). The
//! price is a slot idle during a pause; keep pauses short against a
//! saturated service, or let the budget stop them.
//!
//! A call nested inside another call's attempt takes a slot only if it is
//! given a limit itself. The blocking door (`run_blocking`) takes a free slot
//! or stops with `Saturated` at once: a thread waiting in a queue holds its
//! resources anyway, so it does not wait (the attribute refuses `concurrency`
//! on a blocking `fn`). A hedged call takes one slot for all its copies.
//!
//! ```
//! use std::time::Duration;
//! use retries::limit::Concurrency;
//! use retries::{Attempt, Policy, Reason};
//!
//! static LIMIT: Concurrency = Concurrency::new(1, Duration::from_millis(100));
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let policy = Policy::new(Duration::from_secs(2));
//! let slow = retries::call(&policy).idempotent().concurrency(&LIMIT).outcome(async |_: &Attempt| {
//!     tokio::time::sleep(Duration::from_secs(1)).await;
//!     Ok::<_, std::io::Error>("slow")
//! });
//! let waiting = retries::call(&policy).idempotent().concurrency(&LIMIT).outcome(async |_: &Attempt| {
//!     Ok::<_, std::io::Error>("never sent")
//! });
//! let (slow, waiting) = tokio::join!(slow, waiting);
//! assert_eq!(slow.unwrap(), "slow");
//! assert_eq!(waiting.unwrap_err().reason(), Reason::Saturated); // after 100 ms of waiting
//! # }
//! ```
//!
//! # The server side
//!
//! [`ShedLayer`] (feature `tower`) puts a limit in front of a server's
//! service: a request that finds it full is answered at once, without
//! reaching the service, with gRPC `RESOURCE_EXHAUSTED` and
//! `grpc-retry-pushback-ms` (for `application/grpc` requests) or HTTP 503
//! with `Retry-After`. Both are read by this crate's clients as "not
//! executed, retry after the hint", so an overloaded server says so honestly
//! instead of queueing calls without bound.

use std::time::Duration;

#[cfg(feature = "tower")]
pub use shed::{OwnedSlot, ShedFuture, ShedLayer, ShedService};

/// A concurrency limit with bounded waiting, shared by the calls given it;
/// see the [module docs](self). `const`-constructible for a `static`.
#[derive(Debug)]
pub struct Concurrency {
    semaphore: tokio::sync::Semaphore,
    slots: u32,
    max_wait: Duration,
}

/// The number of slots was 0: no call could ever run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a concurrency limit needs at least one slot")]
pub struct LimitError;

impl Concurrency {
    /// `slots` calls at once (0 counts as 1: use [`try_new`](Self::try_new)
    /// to have it refused; more than tokio's semaphore holds counts as its
    /// maximum); a call waits at most `max_wait` for a slot
    /// (zero: it takes a free slot or stops at once).
    #[must_use]
    pub const fn new(slots: u32, max_wait: Duration) -> Self {
        let slots = if slots == 0 { 1 } else { slots };
        // tokio's ceiling (2^61 − 1 on 64-bit targets, 2^29 − 1 on 32-bit).
        let max = tokio::sync::Semaphore::MAX_PERMITS;
        let slots = if slots as usize > max {
            max as u32
        } else {
            slots
        };
        Self {
            semaphore: tokio::sync::Semaphore::const_new(slots as usize),
            slots,
            max_wait,
        }
    }

    /// [`new`](Self::new), refusing 0 slots (for limits read from configuration).
    pub const fn try_new(slots: u32, max_wait: Duration) -> Result<Self, LimitError> {
        if slots == 0 {
            return Err(LimitError);
        }
        Ok(Self::new(slots, max_wait))
    }

    /// The number of slots.
    #[must_use]
    pub const fn slots(&self) -> u32 {
        self.slots
    }

    /// The longest a call waits for a slot.
    #[must_use]
    pub const fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// Calls holding a slot now.
    #[must_use]
    pub fn in_flight(&self) -> u32 {
        self.slots - self.semaphore.available_permits() as u32
    }

    /// A free slot, if there is one now.
    #[inline]
    pub(crate) fn try_take(&self) -> Option<Slot<'_>> {
        self.semaphore.try_acquire().ok().map(Slot)
    }

    /// A slot, waiting in turn (first come first served) for one.
    pub(crate) async fn take(&self) -> Slot<'_> {
        match self.semaphore.acquire().await {
            Ok(permit) => Slot(permit),
            // The semaphore is never closed.
            Err(_) => unreachable!("a `Concurrency` is never closed"),
        }
    }

    /// Give back a slot that a call [kept](Slot::keep).
    #[inline]
    pub(crate) fn give_back(&self) {
        self.semaphore.add_permits(1);
    }
}

/// A slot of a [`Concurrency`], just taken.
#[derive(Debug)]
#[must_use = "a slot is given back when dropped, unless kept"]
pub struct Slot<'a>(tokio::sync::SemaphorePermit<'a>);

impl Slot<'_> {
    /// Keep the slot until [`Concurrency::give_back`]: the engine records
    /// that it holds one in a flag (in its padding) rather than storing the
    /// permit, so a call without a limit stores nothing for it.
    #[inline]
    pub(crate) fn keep(self) {
        self.0.forget();
    }
}

#[cfg(feature = "tower")]
mod shed {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use http::{HeaderValue, Request, Response, StatusCode};

    use super::Concurrency;

    /// The server side of backpressure: at most `slots` requests reach the
    /// service at once; one that finds them all taken is answered at once
    /// (it does not queue) with gRPC `RESOURCE_EXHAUSTED` (HTTP 200,
    /// trailers-only, `grpc-retry-pushback-ms`) when its `content-type` is
    /// `application/grpc…`, else HTTP 503 with `Retry-After` (whole seconds,
    /// rounded up). The response body is the body type's `Default` (empty
    /// for tonic's and axum's).
    ///
    /// ```
    /// use std::time::Duration;
    /// use retries::limit::ShedLayer;
    ///
    /// // 64 requests at once; beyond that, "come back in 50 ms".
    /// let layer = ShedLayer::new(64, Duration::from_millis(50));
    /// assert_eq!(layer.limit().slots(), 64);
    /// ```
    #[derive(Debug, Clone)]
    pub struct ShedLayer {
        limit: Arc<Concurrency>,
        pushback: Duration,
    }

    impl ShedLayer {
        /// `slots` requests at once (0 counts as 1); a refused request is
        /// told to come back after `pushback`.
        #[must_use]
        pub fn new(slots: u32, pushback: Duration) -> Self {
            Self {
                limit: Arc::new(Concurrency::new(slots, Duration::ZERO)),
                pushback,
            }
        }

        /// The limit, shared by every service this layer makes.
        #[must_use]
        pub fn limit(&self) -> &Concurrency {
            &self.limit
        }
    }

    impl<S> tower_layer::Layer<S> for ShedLayer {
        type Service = ShedService<S>;
        fn layer(&self, inner: S) -> ShedService<S> {
            ShedService {
                inner,
                limit: Arc::clone(&self.limit),
                pushback: self.pushback,
            }
        }
    }

    /// The service of [`ShedLayer`].
    #[derive(Debug, Clone)]
    pub struct ShedService<S> {
        inner: S,
        limit: Arc<Concurrency>,
        pushback: Duration,
    }

    impl<S, B, ResB> tower_service::Service<Request<B>> for ShedService<S>
    where
        S: tower_service::Service<Request<B>, Response = Response<ResB>>,
        ResB: Default,
    {
        type Response = Response<ResB>;
        type Error = S::Error;
        type Future = ShedFuture<S::Future, ResB>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, request: Request<B>) -> Self::Future {
            match OwnedSlot::take(&self.limit) {
                Some(slot) => ShedFuture::Admitted {
                    fut: self.inner.call(request),
                    _slot: slot,
                },
                None => ShedFuture::Refused {
                    response: Some(refusal(&request, self.pushback)),
                },
            }
        }
    }

    pin_project_lite::pin_project! {
        /// The future of [`ShedService`]: the service's own, holding a
        /// slot, or the refusal.
        #[project = ShedProj]
        #[allow(missing_docs)]
        pub enum ShedFuture<F, ResB> {
            /// Admitted: the service's future, with its slot.
            Admitted { #[pin] fut: F, _slot: OwnedSlot },
            /// Refused at once.
            Refused { response: Option<Response<ResB>> },
        }
    }

    impl<F, ResB, Er> Future for ShedFuture<F, ResB>
    where
        F: Future<Output = Result<Response<ResB>, Er>>,
    {
        type Output = Result<Response<ResB>, Er>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            match self.project() {
                ShedProj::Admitted { fut, .. } => fut.poll(cx),
                ShedProj::Refused { response } => match response.take() {
                    Some(r) => Poll::Ready(Ok(r)),
                    None => Poll::Pending,
                },
            }
        }
    }

    /// A slot held by a request in a server (the limit stays alive with it).
    #[derive(Debug)]
    pub struct OwnedSlot(Arc<Concurrency>);

    impl OwnedSlot {
        fn take(limit: &Arc<Concurrency>) -> Option<Self> {
            // `Concurrency` owns its semaphore by value (so it can be a
            // `static`): the permit is forgotten here and given back on drop.
            let permit = limit.semaphore.try_acquire().ok()?;
            permit.forget();
            Some(Self(Arc::clone(limit)))
        }
    }

    impl Drop for OwnedSlot {
        fn drop(&mut self) {
            self.0.semaphore.add_permits(1);
        }
    }

    fn refusal<B, ResB: Default>(request: &Request<B>, pushback: Duration) -> Response<ResB> {
        let grpc = request
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        let mut response = Response::new(ResB::default());
        if !grpc {
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        }
        let headers = response.headers_mut();
        if grpc {
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            headers.insert("grpc-status", HeaderValue::from_static("8"));
            headers.insert(
                "grpc-message",
                HeaderValue::from_static("server%20concurrency%20limit%20full"),
            );
            headers.insert(
                "grpc-retry-pushback-ms",
                HeaderValue::from(u64::try_from(pushback.as_millis()).unwrap_or(u64::MAX)),
            );
        } else {
            let secs = pushback
                .as_secs()
                .saturating_add(u64::from(pushback.subsec_nanos() > 0));
            headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
