//! Zero heap allocations per call on the happy path, with the default budget
//! and a circuit breaker enabled, through `#[retryable]` and `retries::call`.
//! Counted by a global allocator, per thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use retries::{Attempt, CircuitBreaker, Classify, Policy, TokenBucket, retryable};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

#[allow(unsafe_code)] // a global allocator is an unsafe trait; this one only counts
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Poll a future that must complete at once (no runtime needed: the happy
/// path arms no timer).
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the happy path suspended"),
    }
}

#[derive(Debug, thiserror::Error, Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

#[retryable(deadline = "2s", max_attempts = 3, idempotent, attempt = at,
            breaker(failure_threshold = 5, open_for = "10s"))]
async fn happy(x: u64) -> Result<u64, E> {
    Ok(x + u64::from(at.number()))
}

static BUDGET: TokenBucket = TokenBucket::DEFAULT;
static BREAKER: CircuitBreaker = CircuitBreaker::new(5, Duration::from_secs(10));
const POLICY: Policy = Policy::new(Duration::from_secs(2)).validated();

#[test]
fn no_allocation_on_the_happy_path() {
    // Warm up anything lazily initialised once per process.
    assert_eq!(ready(happy(1)).unwrap(), 2);
    let before = allocations();
    let mut sum = 0;
    for i in 0..10_000 {
        sum += ready(happy(i)).unwrap();
    }
    assert_eq!(allocations() - before, 0, "allocations in 10,000 calls");
    assert_eq!(sum, (0..10_000).map(|i| i + 1).sum::<u64>());

    let before = allocations();
    for i in 0..10_000u64 {
        let r: Result<u64, E> = ready(
            retries::call(&POLICY)
                .idempotent()
                .budget(&BUDGET)
                .breaker(&BREAKER)
                .run(async |at: &Attempt| Ok(i * u64::from(at.number()))),
        );
        assert_eq!(r.unwrap(), i);
    }
    assert_eq!(
        allocations() - before,
        0,
        "allocations in 10,000 builder calls"
    );
}

#[retryable(deadline = "2s", max_attempts = 3, idempotent, attempt = at, budget = "none",
            backoff = "constant", initial_backoff = "0ms")]
async fn fails_once(x: u64) -> Result<u64, E> {
    if at.number() == 1 {
        return Err(E::Refused);
    }
    Ok(x)
}

#[retryable(
    deadline = "2s",
    max_attempts = 2,
    idempotent,
    budget = "none",
    backoff = "constant",
    initial_backoff = "0ms"
)]
async fn always_fails(_x: u64) -> Result<u64, E> {
    Err(E::Refused)
}

/// What a call keeps once an attempt has failed (its last error, the
/// backoff sequence) is made at its first failure, in one allocation, and
/// only then: a call that succeeds at once never makes it (above), a call
/// that fails makes it once however many attempts fail, and gives it back.
#[test]
fn the_retry_state_is_one_allocation_made_at_the_first_failure() {
    // A zero pause: the retry runs in the same poll, with no timer. The
    // first call also makes its name's failure keys (with `metrics`, which
    // this package turns on): once per name, kept.
    assert_eq!(ready(fails_once(1)).unwrap(), 1);
    let before = allocations();
    for i in 0..1_000 {
        assert_eq!(ready(fails_once(i)).unwrap(), i);
    }
    assert_eq!(
        allocations() - before,
        1_000,
        "one per call that failed once"
    );

    // The first failures of a name make its failure keys (with `metrics`).
    assert!(matches!(ready(always_fails(0)), Err(E::Refused)));
    let before = allocations();
    for i in 0..1_000 {
        assert!(matches!(ready(always_fails(i)), Err(E::Refused)));
    }
    assert_eq!(
        allocations() - before,
        1_000,
        "one per call, for its two failed attempts"
    );
}

#[test]
fn the_counter_counts() {
    // Guard against a test that cannot fail: a boxed value is seen.
    let before = allocations();
    let b = std::hint::black_box(Box::new(7u64));
    assert_eq!(allocations() - before, 1);
    drop(b);
    let _ = E::Refused;
}

/// The tower layer's cost per request on the happy path, over an in-process
/// service that answers at once: against calling the service directly
/// (an empty body needs no replay buffer, through the layer or not),
/// exactly five allocations more: the boxed response future, the request's
/// head boxed apart from it (so that the future stays within what the
/// system allocator serves from its per-thread cache: two small allocations
/// cost less than one large one), and the deadline every attempt carries
/// on the wire (`retries-timeout-ms`: its value, and, for this request that
/// had no header at all, the header map's two tables; a request with
/// headers has room for it).
#[test]
fn the_tower_layer_adds_its_future_its_head_and_the_deadline_header() {
    use http_body_util::Empty;
    use retries_tower::ReplayBody;
    use tower::Service;

    type B = Empty<bytes::Bytes>;
    fn request<T>(body: T) -> http::Request<T> {
        http::Request::builder()
            .uri("http://service/item")
            .body(body)
            .unwrap()
    }
    let respond = |_r: http::Request<ReplayBody<B>>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(()))
    };
    let mut direct = tower::service_fn(respond);
    let mut layered = retries_tower::RetryLayer::new(POLICY)
        .breaker(&BREAKER)
        .layer(tower::service_fn(respond));
    let replay = |b: B| retries_http::Replay::new(b, 1024).body();
    // Warm up.
    ready(direct.call(request(replay(Empty::new())))).unwrap();
    ready(layered.call(request(Empty::new()))).unwrap();

    let before = allocations();
    for _ in 0..1_000 {
        // The same work the layer does for its one attempt, minus the layer.
        let r = request(replay(Empty::new()));
        assert_eq!(ready(direct.call(r)).unwrap().status(), 200);
    }
    let direct_allocations = allocations() - before;
    let before = allocations();
    for _ in 0..1_000 {
        assert_eq!(
            ready(layered.call(request(Empty::new()))).unwrap().status(),
            200
        );
    }
    let layered_allocations = allocations() - before;
    // The boxed future and head, the header's value, the map's two tables.
    assert_eq!(
        layered_allocations - direct_allocations,
        5_000,
        "direct {direct_allocations}, layered {layered_allocations}"
    );
}

/// A body that has ended before it is read (a GET's) gets no replay buffer:
/// no allocation for it, however many attempts read it; a body with data
/// gets its buffer.
#[test]
fn an_empty_body_is_replayed_without_a_buffer() {
    use http_body_util::{BodyExt, Empty, Full};

    let before = allocations();
    for _ in 0..1_000 {
        let replay = retries_http::Replay::new(Empty::<bytes::Bytes>::new(), 1024);
        for _ in 0..3 {
            let body = replay.body();
            assert!(http_body::Body::is_end_stream(&body));
            assert_eq!(http_body::Body::size_hint(&body).exact(), Some(0));
            let mut body = std::pin::pin!(body);
            assert!(ready(body.frame()).is_none());
        }
        assert!(replay.lost().is_none());
    }
    assert_eq!(
        allocations() - before,
        0,
        "allocations for 1,000 empty bodies"
    );

    let before = allocations();
    let replay = retries_http::Replay::new(Full::new(bytes::Bytes::from_static(b"abc")), 1024);
    let mut first = std::pin::pin!(replay.body());
    let data = ready(first.frame()).unwrap().unwrap().into_data().unwrap();
    assert_eq!(&data[..], b"abc");
    assert!(allocations() - before >= 1, "a body with data is buffered");
    let mut again = std::pin::pin!(replay.body());
    let data = ready(again.frame()).unwrap().unwrap().into_data().unwrap();
    assert_eq!(&data[..], b"abc", "and replayed");
}
