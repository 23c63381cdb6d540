//! Fault injection on the wire (`retries::chaos`), with a real axum server
//! and real clients on loopback: each fault kind as the client meets it
//! (a dropped reply is a closed connection with not a byte of the answer,
//! after the handler's effect), rates over 10,000 requests with a fixed
//! seed, the switch and the rates changed while the server runs, scopes, and
//! the client middleware under the retry middleware.

use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use reqwest_middleware::ClientBuilder;
use retries::Policy;
use retries::backoff::Backoff;
use retries::wire::TIMEOUT_MS;
use retries_chaos::{
    Chaos, ClientFaultLayer, Fault, FaultKind, FaultLayer, FaultMiddleware, Injected, Rule,
};
use retries_reqwest::RetryMiddleware;
use retries_tower::RetryLayer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::{Layer as _, Service as _, ServiceExt as _};

/// A charges service whose handler reports its effect (by the request's
/// `idempotency-key`, or a fresh one) to `chaos`, behind its `FaultLayer`.
async fn serve(chaos: &Chaos) -> String {
    let handler = |State(chaos): State<Chaos>, headers: HeaderMap| async move {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map_or_else(|| format!("{:?}", Instant::now()), str::to_string);
        chaos.effect(&key);
        "charged"
    };
    let app = Router::new()
        .route("/charges", post(handler))
        .route("/health", get(|| async { "ok" }))
        .with_state(chaos.clone())
        .layer(FaultLayer::new(chaos.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("{addr}")
}

/// One `POST /charges` through a fresh client.
async fn charge(addr: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("http://{addr}/charges"))
        .send()
        .await
        .unwrap()
}

fn one(fault: Fault) -> Chaos {
    Chaos::builder().rule(Rule::new(fault)).build().unwrap()
}

/// The raw bytes a server sends back to one HTTP/1.1 request.
async fn raw(addr: &str, request: &str) -> Vec<u8> {
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    // EOF or a reset: either way the answer is what arrived before it.
    let _ = tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut answer))
        .await
        .expect("the server closes the connection");
    answer
}

#[tokio::test]
async fn a_dropped_reply_closes_the_connection_after_the_effect_with_not_a_byte_sent() {
    let chaos = one(Fault::DropReply);
    let addr = serve(&chaos).await;
    let answer = raw(
        &addr,
        "POST /charges HTTP/1.1\r\nhost: x\r\nidempotency-key: k1\r\ncontent-length: 0\r\n\r\n",
    )
    .await;
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    // Through reqwest: a connection closed before the answer, after the charge.
    let err = reqwest::Client::new()
        .post(format!("http://{addr}/charges"))
        .header("idempotency-key", "k2")
        .send()
        .await
        .unwrap_err();
    assert!(err.is_request() && !err.is_connect(), "{err:?}");
    let report = chaos.report();
    assert_eq!((report.requests, report.effects), (2, 2));
    assert_eq!(report.injected(FaultKind::DropReply), 2);
    assert_eq!(report.observed(FaultKind::DropReply), 2);
}

#[tokio::test]
async fn a_refusal_answers_before_the_handler() {
    let chaos = one(Fault::Refuse {
        retry_after: Some(Duration::from_millis(1500)),
    });
    let addr = serve(&chaos).await;
    let response = charge(&addr).await;
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "2");
    let report = chaos.report();
    assert_eq!(report.effects, 0);
    assert_eq!(report.observed(FaultKind::Refuse), 1);
}

/// A server-side refusal with no pause given still says "refused before
/// the work" (`Retry-After: 0`), so the retry middleware resends a `POST`
/// it refused: the handler runs once, the call succeeds.
#[tokio::test]
async fn a_refused_post_is_sent_again() {
    let chaos = one(Fault::Refuse { retry_after: None });
    let addr = serve(&chaos).await;
    let switch = chaos.clone();
    let after_two = tokio::spawn(async move {
        while switch.report().injected(FaultKind::Refuse) < 2 {
            tokio::task::yield_now().await;
        }
        switch.set_enabled(false);
    });
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy()).budget(retries::NoBudget))
        .build();
    let response = client
        .post(format!("http://{addr}/charges"))
        .send()
        .await
        .unwrap();
    after_two.await.unwrap();
    assert_eq!(response.status(), 200, "refused twice, then charged");
    let report = chaos.report();
    assert_eq!(report.observed(FaultKind::Refuse), 2);
    assert_eq!(report.effects, 1);
}

#[tokio::test]
async fn fail_after_answers_its_status_after_the_effect() {
    let chaos = one(Fault::FailAfter {
        http_status: 500,
        grpc_code: 13,
    });
    let addr = serve(&chaos).await;
    let response = charge(&addr).await;
    assert_eq!(response.status(), 500);
    let report = chaos.report();
    assert_eq!(report.effects, 1);
    assert_eq!(report.observed(FaultKind::FailAfter), 1);
}

#[tokio::test]
async fn a_delay_comes_before_the_handler() {
    let chaos = one(Fault::Delay(Duration::from_millis(300)));
    let addr = serve(&chaos).await;
    let t0 = Instant::now();
    let response = charge(&addr).await;
    let took = t0.elapsed();
    assert_eq!(response.text().await.unwrap(), "charged");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_eq!(chaos.report().observed(FaultKind::Delay), 1);
}

/// A charge sent with `retries-timeout-ms: ms` to a server that hangs: it
/// answers 504 when that time is up; how long it took.
async fn hung(addr: &str, ms: &str) -> Duration {
    let t0 = Instant::now();
    let response = reqwest::Client::new()
        .post(format!("http://{addr}/charges"))
        .header(TIMEOUT_MS, ms)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 504);
    t0.elapsed()
}

#[tokio::test]
async fn a_hang_lasts_until_the_callers_deadline_on_the_wire_and_never_runs_the_handler() {
    let chaos = one(Fault::Hang {
        max: Duration::from_secs(30),
    });
    let addr = serve(&chaos).await;
    let took = hung(&addr, "400").await;
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // A caller that leaves ends the hang (counted when the server notices).
    let gone = reqwest::Client::new()
        .post(format!("http://{addr}/charges"))
        .timeout(Duration::from_millis(200))
        .send()
        .await
        .unwrap_err();
    assert!(gone.is_timeout(), "{gone:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while chaos.report().observed(FaultKind::Hang) < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = chaos.report();
    assert_eq!(report.effects, 0);
    assert_eq!(
        (
            report.injected(FaultKind::Hang),
            report.observed(FaultKind::Hang)
        ),
        (2, 2)
    );
}

/// Bounds too large to add to a clock (a hang or a delay of
/// `Duration::MAX`) are as good as forever, never a panic; after a delay, a
/// hang still ends at the caller's deadline counted from arrival.
#[tokio::test]
async fn the_largest_bounds_do_not_overflow_and_a_hang_after_a_delay_keeps_the_deadline() {
    let chaos = Chaos::builder()
        .rule(Rule::new(Fault::Delay(Duration::from_millis(400))))
        .rule(Rule::new(Fault::Hang { max: Duration::MAX }))
        .build()
        .unwrap();
    let addr = serve(&chaos).await;
    let took = hung(&addr, "800").await;
    // 800 ms from arrival, not 400 + 800.
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_millis(1150),
        "{took:?}"
    );
    let forever = one(Fault::Delay(Duration::MAX));
    let r: Result<(), Injected> = tokio::time::timeout(
        Duration::from_millis(50),
        forever.around("work", async { Ok(()) }),
    )
    .await
    .unwrap_or(Ok(()));
    assert_eq!(r, Ok(()));
    assert_eq!(forever.report().observed(FaultKind::Delay), 0);
}

/// 10,000 requests on one connection, each rule at its rate: the counts
/// within 3 % of the rate (a fixed seed: the same every run), and the same
/// seed gives the same answers in the same order.
#[tokio::test]
async fn rates_hold_over_ten_thousand_requests_and_a_seed_repeats_its_run() {
    let make = || {
        Chaos::builder()
            .seed(2026)
            .rule(Rule::new(Fault::Refuse { retry_after: None }).rate(0.2))
            .rule(
                Rule::new(Fault::FailAfter {
                    http_status: 500,
                    grpc_code: 13,
                })
                .rate(0.1),
            )
            .build()
            .unwrap()
    };
    let mut runs = Vec::new();
    for _ in 0..2 {
        let chaos = make();
        let addr = serve(&chaos).await;
        let client = reqwest::Client::new();
        let mut statuses = Vec::with_capacity(10_000);
        for _ in 0..10_000 {
            let r = client
                .post(format!("http://{addr}/charges"))
                .send()
                .await
                .unwrap();
            statuses.push(r.status().as_u16());
        }
        let refused = statuses.iter().filter(|&&s| s == 503).count();
        let failed = statuses.iter().filter(|&&s| s == 500).count();
        // A refusal wins over a fault after the work: 0.1 × 0.8 of requests.
        assert!((1_700..=2_300).contains(&refused), "{refused}");
        assert!((500..=1_100).contains(&failed), "{failed}");
        let report = chaos.report();
        assert_eq!(report.requests, 10_000);
        assert_eq!(report.injected(FaultKind::Refuse), refused as u64);
        assert_eq!(report.injected(FaultKind::FailAfter), failed as u64);
        assert_eq!(report.effects, 10_000 - refused as u64);
        runs.push(statuses);
    }
    assert_eq!(runs[0], runs[1]);
}

#[tokio::test]
async fn the_switch_and_the_rates_change_while_running_and_a_disabled_layer_does_nothing() {
    let chaos = Chaos::builder()
        .rule(Rule::new(Fault::Refuse { retry_after: None }))
        .start_disabled()
        .build()
        .unwrap();
    let addr = serve(&chaos).await;
    let client = reqwest::Client::new();
    let status = async |client: &reqwest::Client| {
        client
            .post(format!("http://{addr}/charges"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    for _ in 0..20 {
        assert_eq!(status(&client).await, 200);
    }
    assert_eq!(chaos.report().injected(FaultKind::Refuse), 0);
    // Turned on from another task, as an admin endpoint would.
    let switch = chaos.clone();
    tokio::spawn(async move { switch.set_enabled(true) })
        .await
        .unwrap();
    assert_eq!(status(&client).await, 503);
    chaos.set_rate(FaultKind::Refuse, 0.0).unwrap();
    assert_eq!(status(&client).await, 200);
    chaos.set_rate(FaultKind::Refuse, 1.0).unwrap();
    assert_eq!(status(&client).await, 503);
    chaos.set_enabled(false);
    assert_eq!(status(&client).await, 200);
    let report = chaos.report();
    assert_eq!(
        (report.requests, report.injected(FaultKind::Refuse)),
        (24, 2)
    );
}

#[tokio::test]
async fn a_scope_limits_the_blast_radius() {
    let chaos = Chaos::builder()
        .rule(Rule::new(Fault::Refuse { retry_after: None }).only(["POST /charges"]))
        .build()
        .unwrap();
    let addr = serve(&chaos).await;
    let client = reqwest::Client::new();
    let health = client
        .get(format!("http://{addr}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let charge = client
        .post(format!("http://{addr}/charges"))
        .send()
        .await
        .unwrap();
    assert_eq!(charge.status(), 503);
}

/// The injected fault behind a middleware error: an `io::Error` whose inner
/// error is the `Injected`.
fn injected(err: &reqwest_middleware::Error) -> Option<(std::io::ErrorKind, FaultKind)> {
    let reqwest_middleware::Error::Middleware(e) = err else {
        return None;
    };
    let io = e.downcast_ref::<std::io::Error>()?;
    let inner = io.get_ref()?.downcast_ref::<Injected>()?;
    Some((io.kind(), inner.kind()))
}

fn policy() -> Policy {
    Policy::new(Duration::from_secs(5))
        .with_max_attempts(3)
        .with_backoff(Backoff::constant(Duration::from_millis(10)))
}

/// The client middleware under the retry middleware: a refused connection
/// (nothing sent) is retried even for a POST; a lost answer (sent, the
/// server's effect done) is not replayed for a POST and is for a GET.
#[tokio::test]
async fn the_client_middleware_meets_each_attempt_under_the_retry_middleware() {
    let server = Chaos::builder().build().unwrap();
    let addr = serve(&server).await;
    let client = |chaos: &Chaos| {
        ClientBuilder::new(reqwest::Client::new())
            .with(RetryMiddleware::new(policy()))
            .with(FaultMiddleware::new(chaos.clone()))
            .build()
    };
    // Refused twice before sending, then through.
    let refuse = Chaos::builder()
        .rule(Rule::new(Fault::Refuse { retry_after: None }))
        .build()
        .unwrap();
    let c = client(&refuse);
    let switch = refuse.clone();
    let pending = tokio::spawn(async move {
        while switch.report().injected(FaultKind::Refuse) < 2 {
            tokio::task::yield_now().await;
        }
        switch.set_enabled(false);
    });
    let response = c
        .post(format!("http://{addr}/charges"))
        .send()
        .await
        .unwrap();
    pending.await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(server.report().effects, 1);

    // The answer lost after the effect: a POST is not replayed blindly. The
    // caller gets a stop that says the outcome is unknown, the lost
    // answer's error as its source.
    let lose = one(Fault::DropReply);
    let err = client(&lose)
        .post(format!("http://{addr}/charges"))
        .send()
        .await
        .unwrap_err();
    let reqwest_middleware::Error::Middleware(stop) = &err else {
        panic!("{err:?}");
    };
    let stop = stop.downcast_ref::<retries::Stopped>().expect("a stop");
    assert_eq!(stop.reason(), retries::Reason::UnknownOutcome);
    let source = std::error::Error::source(stop).expect("the last error");
    let source = source
        .downcast_ref::<reqwest_middleware::Error>()
        .expect("the middleware's error");
    assert_eq!(
        injected(source),
        Some((std::io::ErrorKind::ConnectionReset, FaultKind::DropReply)),
        "{err:?}"
    );
    assert_eq!(server.report().effects, 2);
    assert_eq!(lose.report().observed(FaultKind::DropReply), 1);
    // A GET is idempotent: all three attempts are made, all lost.
    let err = client(&lose)
        .get(format!("http://{addr}/health"))
        .send()
        .await
        .unwrap_err();
    drop(err);
    assert_eq!(lose.report().observed(FaultKind::DropReply), 4);
}

/// The client layer under the retry layer, over a hyper client: a refused
/// connection (nothing sent) is retried even for a POST, a lost answer
/// (sent, the effect done) is not replayed for a POST and is for a GET, an
/// error answer after the work is the answer.
#[tokio::test]
async fn the_client_layer_meets_each_attempt_under_the_retry_layer() {
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let server = Chaos::builder().build().unwrap();
    let addr = serve(&server).await;
    let send = async |chaos: &Chaos, method: &str, path: &str| {
        let client = Client::builder(TokioExecutor::new()).build_http();
        let mut svc =
            RetryLayer::new(policy()).layer(ClientFaultLayer::new(chaos.clone()).layer(client));
        let request = http::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        svc.ready().await.unwrap().call(request).await
    };
    let refuse = one(Fault::Refuse { retry_after: None });
    let err = send(&refuse, "POST", "/charges").await.unwrap_err();
    assert_eq!(refuse.report().observed(FaultKind::Refuse), 3, "{err}");
    assert_eq!(server.report().requests, 0);

    let lose = one(Fault::DropReply);
    send(&lose, "POST", "/charges").await.unwrap_err();
    assert_eq!(lose.report().observed(FaultKind::DropReply), 1);
    assert_eq!(server.report().effects, 1);
    send(&lose, "GET", "/health").await.unwrap_err();
    assert_eq!(lose.report().observed(FaultKind::DropReply), 4);

    let fail = one(Fault::FailAfter {
        http_status: 400,
        grpc_code: 3,
    });
    let response = send(&fail, "POST", "/charges").await.unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(server.report().effects, 2);
}
