//! The next attempt on another replica: the endpoints a call has tried, as
//! a request extension ([`Tried`]), and a balancer that reads it ([`P2c`]).
//!
//! Behind a balancer of several replicas the commonest failure is one bad
//! replica, and a retry sent back through the balancer may land on it again
//! (a replica that fails fast looks lightly loaded to a balancer that counts
//! requests in flight, so it is picked *more*). With
//! [`RetryLayer::avoid_tried`](crate::RetryLayer::avoid_tried) the layer
//! gives each request one [`Tried`] record, shared by all its attempts (and
//! hedged copies); a balancer under the layer writes into it the endpoint it
//! picked and, for a later attempt, picks among the endpoints not tried
//! while any is left: Envoy's `previous_hosts` retry predicate, with no
//! limit on how many picks it may take.
//!
//! ```
//! use std::time::Duration;
//! use retries::Policy;
//! use retries_tower::RetryLayer;
//! use retries_tower::balance::P2c;
//! use tower::discover::ServiceList;
//! # #[derive(Clone)] struct Replica;
//! # impl tower_service::Service<http::Request<retries_tower::ReplayBody<String>>> for Replica {
//! #     type Response = http::Response<String>;
//! #     type Error = std::convert::Infallible;
//! #     type Future = std::future::Ready<Result<http::Response<String>, std::convert::Infallible>>;
//! #     fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> { std::task::Poll::Ready(Ok(())) }
//! #     fn call(&mut self, _: http::Request<retries_tower::ReplayBody<String>>) -> Self::Future { std::future::ready(Ok(http::Response::new(String::new()))) }
//! # }
//! # let replicas = vec![Replica, Replica, Replica];
//!
//! let balancer = P2c::new(ServiceList::new(replicas));
//! let client = RetryLayer::new(Policy::new(Duration::from_secs(2)))
//!     .avoid_tried() // the one line: a retry goes to a replica not yet tried
//!     .layer(balancer);
//! # let _ = client;
//! ```
//!
//! The rules, chosen here:
//!
//! * **While an endpoint is left untried, a later attempt goes to one**; the
//!   power of two choices (the one of two random picks with fewer requests
//!   in flight) runs among the untried only. Once every endpoint has been
//!   tried (a single endpoint, or every replica failed once), the pick runs
//!   among all of them, as without the record: the call is never refused
//!   for want of a fresh endpoint.
//! * An endpoint is *tried* once an attempt was sent to it, whatever came
//!   back; a hedged copy in flight counts too, so the next copy goes
//!   elsewhere.
//! * An endpoint is named by its discovery key, hashed
//!   ([`Tried::record`], [`Tried::contains`]): a balancer of another crate
//!   honours the record by calling those two with its own keys.
//! * A balancer that ignores the extension works as before (the record is
//!   only read); a request without the extension (a layer without
//!   `avoid_tried`, or no retry layer at all) is balanced as by any p2c.
//!
//! [`P2c`] holds endpoint services that are `Clone` (a hyper client aimed at
//! one replica with [`At`], a `tonic::transport::Channel` to one address):
//! each request is sent on a clone of the endpoint it picked, made ready in
//! the request's own future, so one slow endpoint never holds up the others.

use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker, ready};

use http::Request;
use http::uri::{Authority, Uri};
use retries_http::BoxError;
use tower::discover::{Change, Discover};

/// The endpoints a call has tried: a request extension shared by every
/// attempt of one call (its clones share one record). See the
/// [module docs](self).
#[derive(Clone, Default)]
pub struct Tried(Arc<Mutex<Vec<u64>>>);

impl std::fmt::Debug for Tried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Tried").field(&self.len()).finish()
    }
}

impl Tried {
    /// An empty record, for one call.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The endpoint named `key` was sent an attempt of this call.
    pub fn record(&self, key: &impl Hash) {
        self.record_id(id_of(key));
    }

    fn record_id(&self, id: u64) {
        let mut ids = self.ids();
        if !ids.contains(&id) {
            ids.push(id);
        }
    }

    /// Was the endpoint named `key` sent an attempt of this call?
    #[must_use]
    pub fn contains(&self, key: &impl Hash) -> bool {
        self.ids().contains(&id_of(key))
    }

    /// How many endpoints the call has tried.
    #[must_use]
    pub fn len(&self) -> usize {
        self.ids().len()
    }

    /// Has the call tried no endpoint yet?
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn ids(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        // A panic while the lock was held left a list of ids, still valid.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// An endpoint's key as the record keeps it: hashed with fixed keys, so the
/// same key gives the same id in every clone of a balancer.
fn id_of(key: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// One endpoint of a [`P2c`].
struct Endpoint<K, S> {
    key: K,
    /// The key as a [`Tried`] record names it, hashed once.
    id: u64,
    service: S,
    /// Requests sent to it and not yet answered (or dropped).
    in_flight: Arc<AtomicUsize>,
}

/// A power-of-two-choices balancer over a [`Discover`] set that honours
/// [`Tried`]: see the [module docs](self). Load is the number of requests
/// in flight to each endpoint.
///
/// `poll_ready` takes the discovery's changes and is ready once an endpoint
/// is known; it fails when the discovery fails, or ends with no endpoint.
/// Clones share the endpoints and the discovery (the retry layer sends each
/// hedged copy on a clone).
pub struct P2c<D: Discover> {
    shared: Arc<Mutex<Set<D>>>,
}

impl<D: Discover> Clone for P2c<D> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// What the clones of one [`P2c`] share.
struct Set<D: Discover> {
    discover: D,
    ended: bool,
    endpoints: Vec<Endpoint<D::Key, D::Service>>,
    /// Clones waiting for a first endpoint: the discovery wakes only the
    /// last task that polled it.
    waiting: Vec<Waker>,
}

impl<D: Discover> std::fmt::Debug for P2c<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("P2c")
            .field("endpoints", &self.len())
            .finish_non_exhaustive()
    }
}

impl<D: Discover> P2c<D> {
    /// A balancer over the endpoints `discover` yields (for a fixed set,
    /// `tower::discover::ServiceList::new(services)`).
    pub fn new(discover: D) -> Self {
        Self {
            shared: Arc::new(Mutex::new(Set {
                discover,
                ended: false,
                endpoints: Vec::new(),
                waiting: Vec::new(),
            })),
        }
    }

    /// How many endpoints the balancer knows now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.set().endpoints.len()
    }

    /// Does the balancer know no endpoint?
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn set(&self) -> std::sync::MutexGuard<'_, Set<D>> {
        // A panic in a discovery stream left the set as it was: still valid.
        self.shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<D> Set<D>
where
    D: Discover + Unpin,
    D::Key: Hash,
    D::Error: Into<BoxError>,
{
    /// Take every change the discovery has now.
    fn discover(&mut self, cx: &mut Context<'_>) -> Result<(), BoxError> {
        while !self.ended {
            match Pin::new(&mut self.discover).poll_discover(cx) {
                Poll::Ready(Some(Ok(Change::Insert(key, service)))) => {
                    self.endpoints.retain(|e| e.key != key);
                    self.endpoints.push(Endpoint {
                        id: id_of(&key),
                        key,
                        service,
                        in_flight: Arc::new(AtomicUsize::new(0)),
                    });
                }
                Poll::Ready(Some(Ok(Change::Remove(key)))) => {
                    self.endpoints.retain(|e| e.key != key);
                }
                Poll::Ready(Some(Err(e))) => return Err(e.into()),
                Poll::Ready(None) => self.ended = true,
                Poll::Pending => break,
            }
        }
        if !self.endpoints.is_empty() || self.ended {
            self.waiting.drain(..).for_each(Waker::wake);
        }
        Ok(())
    }

    /// The endpoint for a request whose call tried the endpoints `tried`.
    fn pick(&self, tried: &[u64]) -> usize {
        let fresh = |e: &Endpoint<D::Key, D::Service>| !tried.contains(&e.id);
        let untried = self.endpoints.iter().filter(|e| fresh(e)).count();
        // Every endpoint tried: all of them are candidates again.
        let n = if untried == 0 {
            self.endpoints.len()
        } else {
            untried
        };
        let nth = |k: usize| {
            self.endpoints
                .iter()
                .enumerate()
                .filter(|(_, e)| untried == 0 || fresh(e))
                .nth(k)
                .map_or(0, |(i, _)| i)
        };
        if n == 1 {
            return nth(0);
        }
        // Two distinct candidates at random; the less loaded wins.
        let a = rand::random_range(0..n);
        let mut b = rand::random_range(0..n - 1);
        if b >= a {
            b += 1;
        }
        let (a, b) = (nth(a), nth(b));
        let load = |i: usize| self.endpoints[i].in_flight.load(Ordering::Relaxed);
        if load(b) < load(a) { b } else { a }
    }
}

impl<D, B> tower_service::Service<Request<B>> for P2c<D>
where
    D: Discover + Unpin,
    D::Key: Hash,
    D::Error: Into<BoxError>,
    D::Service: tower_service::Service<Request<B>> + Clone,
    <D::Service as tower_service::Service<Request<B>>>::Error: Into<BoxError>,
{
    type Response = <D::Service as tower_service::Service<Request<B>>>::Response;
    type Error = BoxError;
    type Future = P2cFuture<D::Service, Request<B>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        let mut set = self.set();
        set.discover(cx)?;
        if !set.endpoints.is_empty() {
            Poll::Ready(Ok(()))
        } else if set.ended {
            Poll::Ready(Err("the balancer's discovery ended with no endpoint".into()))
        } else {
            // The discovery registered this task; the others wait here.
            if !set.waiting.iter().any(|w| w.will_wake(cx.waker())) {
                set.waiting.push(cx.waker().clone());
            }
            Poll::Pending
        }
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let set = self.set();
        if set.endpoints.is_empty() {
            return P2cFuture {
                state: State::Refused {
                    error: Some("P2c::call before poll_ready answered Ready(Ok)".into()),
                },
                _in_flight: None,
            };
        }
        let tried = request.extensions().get::<Tried>();
        // The record's lock is taken once for the pick, and again to write.
        let i = match tried {
            Some(t) => set.pick(&t.ids()),
            None => set.pick(&[]),
        };
        let endpoint = &set.endpoints[i];
        if let Some(tried) = tried {
            tried.record_id(endpoint.id);
        }
        endpoint.in_flight.fetch_add(1, Ordering::Relaxed);
        P2cFuture {
            state: State::Ready {
                service: endpoint.service.clone(),
                request: Some(request),
            },
            _in_flight: Some(InFlight(Arc::clone(&endpoint.in_flight))),
        }
    }
}

/// One request in flight to an endpoint: counted until answered or dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pin_project_lite::pin_project! {
    /// The future of [`P2c`]: the picked endpoint made ready, then called.
    pub struct P2cFuture<S, Req>
    where
        S: tower_service::Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        _in_flight: Option<InFlight>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: tower_service::Service<Req>,
    {
        Ready { service: S, request: Option<Req> },
        Called { #[pin] future: S::Future },
        Refused { error: Option<BoxError> },
    }
}

impl<S, Req> Future for P2cFuture<S, Req>
where
    S: tower_service::Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Ready { service, request } => {
                    ready!(service.poll_ready(cx)).map_err(Into::into)?;
                    let Some(request) = request.take() else {
                        return Poll::Ready(Err("polled after it answered".into()));
                    };
                    let future = service.call(request);
                    this.state.set(State::Called { future });
                }
                StateProj::Called { future } => {
                    return future.poll(cx).map_err(Into::into);
                }
                StateProj::Refused { error } => {
                    return Poll::Ready(Err(error
                        .take()
                        .unwrap_or_else(|| "polled after it answered".into())));
                }
            }
        }
    }
}

/// A client aimed at one replica: every request's URI is given
/// `authority` (and `http` when it has no scheme) before `inner` sends it.
/// With a hyper-util client, one `At` per replica makes the endpoints of a
/// [`P2c`].
#[derive(Debug, Clone)]
pub struct At<S> {
    authority: Authority,
    inner: S,
}

impl<S> At<S> {
    /// `inner`, aimed at `authority` (`"127.0.0.1:3001"`).
    pub fn new(authority: Authority, inner: S) -> Self {
        Self { authority, inner }
    }
}

impl<S, B> tower_service::Service<Request<B>> for At<S>
where
    S: tower_service::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let mut parts = std::mem::take(request.uri_mut()).into_parts();
        parts.authority = Some(self.authority.clone());
        if parts.scheme.is_none() {
            parts.scheme = Some(http::uri::Scheme::HTTP);
        }
        if parts.path_and_query.is_none() {
            parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        }
        // Scheme, authority and path are all set: the parts make a URI.
        *request.uri_mut() = Uri::from_parts(parts).unwrap_or_default();
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::convert::Infallible;
    use std::future::{Ready, poll_fn, ready};

    use tower::discover::ServiceList;
    use tower_service::Service;

    use super::*;

    /// An endpoint answering its own name.
    #[derive(Clone)]
    struct Named(&'static str);

    impl Service<Request<()>> for Named {
        type Response = &'static str;
        type Error = Infallible;
        type Future = Ready<Result<&'static str, Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Request<()>) -> Self::Future {
            ready(Ok(self.0))
        }
    }

    async fn send<D>(p2c: &mut P2c<D>, tried: Option<&Tried>) -> Result<&'static str, BoxError>
    where
        D: Discover<Service = Named> + Unpin,
        D::Key: Hash,
        D::Error: Into<BoxError>,
    {
        poll_fn(|cx| p2c.poll_ready(cx)).await?;
        let mut request = Request::new(());
        if let Some(t) = tried {
            request.extensions_mut().insert(t.clone());
        }
        p2c.call(request).await
    }

    #[test]
    fn a_record_is_shared_by_its_clones_and_keeps_each_key_once() {
        let tried = Tried::new();
        let clone = tried.clone();
        assert!(tried.is_empty());
        clone.record(&"10.0.0.1:80");
        clone.record(&"10.0.0.1:80");
        tried.record(&2_usize);
        assert_eq!(tried.len(), 2);
        assert!(tried.contains(&"10.0.0.1:80") && tried.contains(&2_usize));
        assert!(!tried.contains(&"10.0.0.2:80"));
    }

    #[tokio::test]
    async fn each_attempt_of_a_call_goes_to_an_endpoint_not_yet_tried_while_one_is_left() {
        let mut p2c = P2c::new(ServiceList::new(vec![Named("a"), Named("b"), Named("c")]));
        for _ in 0..50 {
            let tried = Tried::new();
            let mut seen = Vec::new();
            for _ in 0..3 {
                seen.push(send(&mut p2c, Some(&tried)).await.unwrap());
            }
            seen.sort_unstable();
            assert_eq!(seen, ["a", "b", "c"]);
            // All tried: the pick runs among all again.
            assert!(["a", "b", "c"].contains(&send(&mut p2c, Some(&tried)).await.unwrap()));
            assert_eq!(tried.len(), 3);
        }
        // Without a record, any endpoint, each in turn at least once.
        let mut any = Vec::new();
        for _ in 0..200 {
            any.push(send(&mut p2c, None).await.unwrap());
        }
        for name in ["a", "b", "c"] {
            assert!(any.contains(&name));
        }
    }

    #[tokio::test]
    async fn a_single_endpoint_takes_every_attempt() {
        let mut p2c = P2c::new(ServiceList::new(vec![Named("only")]));
        let tried = Tried::new();
        for _ in 0..3 {
            assert_eq!(send(&mut p2c, Some(&tried)).await.unwrap(), "only");
        }
    }

    /// A discovery fed by hand.
    struct Changes(VecDeque<Result<Change<&'static str, Named>, BoxError>>);

    impl futures_core::Stream for Changes {
        type Item = Result<Change<&'static str, Named>, BoxError>;
        fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            Poll::Ready(self.0.pop_front())
        }
    }

    #[tokio::test]
    async fn endpoints_follow_the_discovery_and_its_errors_are_returned() {
        let changes = Changes(VecDeque::from([
            Ok(Change::Insert("a", Named("a"))),
            Ok(Change::Insert("b", Named("b"))),
            Ok(Change::Remove("a")),
        ]));
        let mut p2c = P2c::new(changes);
        for _ in 0..20 {
            assert_eq!(send(&mut p2c, None).await.unwrap(), "b");
        }
        assert_eq!(p2c.len(), 1);

        let failing = Changes(VecDeque::from([Err("the registry is down".into())]));
        let err = send(&mut P2c::new(failing), None).await.unwrap_err();
        assert_eq!(err.to_string(), "the registry is down");

        let err = send(&mut P2c::new(Changes(VecDeque::new())), None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("ended with no endpoint"), "{err}");
    }

    #[tokio::test]
    async fn a_call_before_ready_is_an_error_not_a_panic() {
        let mut p2c = P2c::new(ServiceList::new(Vec::<Named>::new()));
        let err = p2c.call(Request::new(())).await.unwrap_err();
        assert!(err.to_string().contains("before poll_ready"), "{err}");
    }

    #[tokio::test]
    async fn at_aims_a_request_at_its_authority() {
        #[derive(Clone)]
        struct Echo;
        impl Service<Request<()>> for Echo {
            type Response = String;
            type Error = Infallible;
            type Future = Ready<Result<String, Infallible>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, r: Request<()>) -> Self::Future {
                ready(Ok(r.uri().to_string()))
            }
        }
        let mut at = At::new(Authority::from_static("127.0.0.1:3001"), Echo);
        let r = Request::get("/orders?id=7").body(()).unwrap();
        assert_eq!(
            at.call(r).await.unwrap(),
            "http://127.0.0.1:3001/orders?id=7"
        );
        let r = Request::get("https://example.com/x").body(()).unwrap();
        assert_eq!(at.call(r).await.unwrap(), "https://127.0.0.1:3001/x");
    }
}
