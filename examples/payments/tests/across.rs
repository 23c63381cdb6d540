//! Across services over gRPC, real tonic servers on loopback: a chain
//! client → A → B → store where every hop retries 3 times makes 27 store
//! calls per client call when each hop owns its retries, and 3 behind
//! `retries_tower::ServerLayer::grpc()` (what `DeadlineLayer` is), whose error
//! answers carry gRFC A6's `grpc-retry-pushback-ms: -1`. A request with too
//! little time is refused before its handler; a caller that leaves stops the
//! loop beneath it.

use std::time::Duration;

use retries::tonic::{Pushback, pushback};
use retries_payments::{Client, serve_dead_store, serve_hop};
use retries_tower::ServerLayer;
use tonic::Code;

async fn chain(
    layer: ServerLayer,
) -> (
    u32,
    tonic::Status,
    Vec<Option<Duration>>,
    Vec<Option<Duration>>,
) {
    let (store, ledger) = serve_dead_store(layer, "127.0.0.1:0", Duration::ZERO).await;
    let b = serve_hop(store, layer, "127.0.0.1:0").await;
    let a = serve_hop(b.addr, layer, "127.0.0.1:0").await;
    let status = Client::new(a.addr)
        .forward(100)
        .await
        .expect_err("the store is down");
    (ledger.charge_calls(), status, a.deadlines(), b.deadlines())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hops_of_three_attempts_make_three_store_calls_not_27() {
    let (naive, status, _, _) = chain(ServerLayer::grpc().advise_no_retry(false)).await;
    assert_eq!(naive, 27);
    assert_eq!(pushback(&status), Pushback::None);

    let (layered, status, a, b) = chain(ServerLayer::grpc()).await;
    assert_eq!(layered, 3, "only the hop above the store retries");
    assert_eq!((a.len(), b.len()), (1, 1), "A and B ran once each");
    // The handler's own status code is kept; A6's "do not retry" joins it.
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(pushback(&status), Pushback::Stop);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hop_is_bounded_by_its_callers_time_less_the_reserve() {
    let reserve = Duration::from_millis(100);
    let (_, _, a, b) = chain(ServerLayer::grpc().reserve(reserve)).await;
    let (a, b) = (
        a[0].expect("A had a deadline"),
        b[0].expect("B had a deadline"),
    );
    assert!(a + reserve <= Duration::from_secs(5), "A: {a:?}");
    assert!(a > Duration::from_secs(4), "A: {a:?}");
    assert!(b + reserve <= a, "B: {b:?} after A: {a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_little_time_is_refused_before_the_handler_and_not_retried() {
    let (store, ledger) =
        serve_dead_store(ServerLayer::grpc(), "127.0.0.1:0", Duration::ZERO).await;
    let a = serve_hop(
        store,
        ServerLayer::grpc().min_remaining(Duration::from_millis(50)),
        "127.0.0.1:0",
    )
    .await;
    // 30 ms left: refused, DEADLINE_EXCEEDED with "do not retry", and the
    // client's 3 attempts are one.
    let policy = retries::Policy::new(Duration::from_millis(30)).with_max_attempts(3);
    let status = Client::new(a.addr)
        .charge_within(&policy, 1)
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert_eq!(pushback(&status), Pushback::Stop);
    assert!(a.deadlines().is_empty(), "the handler never ran");
    assert_eq!(ledger.charge_calls(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_leaves_stops_the_loop_beneath_it() {
    // B makes 3 attempts against a store that fails after 150 ms each; the
    // client sends no deadline and gives up after 200 ms by dropping its call
    // (the stream is reset), before B's third attempt would start.
    let (store, ledger) = serve_dead_store(
        ServerLayer::grpc(),
        "127.0.0.1:0",
        Duration::from_millis(150),
    )
    .await;
    let slow = serve_hop(store, ServerLayer::grpc(), "127.0.0.1:0").await;
    let client = Client::new(slow.addr);
    let left = tokio::time::timeout(
        Duration::from_millis(200),
        client.charge_without_deadline(1),
    )
    .await;
    assert!(left.is_err(), "the client left before an answer");
    let at_leave = ledger.charge_calls();
    assert_eq!(at_leave, 2, "B was in its second attempt");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        ledger.charge_calls(),
        at_leave,
        "no store call after the caller left"
    );
}
