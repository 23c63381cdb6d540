//! gRPC service configs (gRFC A6): the proposal's examples parse, method
//! names match by method, then service, then default; a corpus of invalid
//! configs is rejected path by path; and a config drives the tower layer in
//! gRPC mode: attempts capped at 5, retryable codes only, A6's backoff,
//! pushback, `grpc-previous-rpc-attempts`, and one throttling bucket per
//! channel. On the paused clock.

// Numbers are read back exactly as they were written.
#![allow(clippy::float_cmp)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use retries::Policy;
use retries_tower::BoxError;
use retries_tower::service_config::ServiceConfig;

use retries_tower::RetryLayer;
use tokio::time::Instant;
use tonic::Code;
use tower::{Service, ServiceExt};

/// The retry policy example of A6, for a service of ours.
const RETRY: &str = r#"{
  "loadBalancingPolicy": "round_robin",
  "methodConfig": [{
    "name": [{"service": "payments.Payments"}],
    "waitForReady": true,
    "retryPolicy": {
      "maxAttempts": 4,
      "initialBackoff": "0.1s",
      "maxBackoff": "1s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}"#;

#[test]
fn the_proposals_examples_parse() {
    let config = ServiceConfig::from_json(RETRY).unwrap();
    let retry = config
        .method("/payments.Payments/Charge")
        .unwrap()
        .retry_policy()
        .unwrap();
    assert_eq!(retry.max_attempts(), 4);
    assert!(retry.retryable_codes().contains(Code::Unavailable));
    assert!(!retry.retryable_codes().contains(Code::Internal));
    let backoff = retry.backoff();
    assert_eq!(
        (backoff.initial(), backoff.max(), backoff.multiplier()),
        (Duration::from_millis(100), Duration::from_secs(1), 2.0)
    );

    // Hedging, with and without a delay; throttling.
    for (delay, expected) in [
        ("\"0.5s\"", Duration::from_millis(500)),
        ("\"0s\"", Duration::ZERO),
    ] {
        let c = ServiceConfig::from_json(&format!(
            r#"{{"methodConfig": [{{"name": [{{"service": "s"}}],
                "hedgingPolicy": {{"maxAttempts": 4, "hedgingDelay": {delay},
                                   "nonFatalStatusCodes": ["UNAVAILABLE", 14, "internal", "Aborted"]}}}}],
                "retryThrottling": {{"maxTokens": 10, "tokenRatio": 0.1}}}}"#
        ))
        .unwrap();
        let h = c.method("/s/m").unwrap().hedging_policy().unwrap();
        assert_eq!((h.max_attempts(), h.delay()), (4, expected));
        for code in [Code::Unavailable, Code::Internal, Code::Aborted] {
            assert!(h.non_fatal_codes().contains(code), "{code:?}");
        }
        let t = c.throttling().unwrap();
        assert_eq!((t.max_tokens(), t.token_ratio()), (10, 0.1));
    }
}

#[test]
fn max_attempts_above_five_are_five_and_ratios_keep_three_decimals() {
    let c = ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 7,
             "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 1,
             "retryableStatusCodes": [14]}}],
            "retryThrottling": {"maxTokens": 1000, "tokenRatio": 0.5466}}"#,
    )
    .unwrap();
    assert_eq!(
        c.method("/any/Method")
            .unwrap()
            .retry_policy()
            .unwrap()
            .max_attempts(),
        5
    );
    assert_eq!(c.throttling().unwrap().token_ratio(), 0.5466);
}

#[test]
fn names_match_by_method_then_service_then_default() {
    let policy = |attempts: u32, code: &str| {
        format!(
            r#"{{"maxAttempts": {attempts}, "initialBackoff": "1s", "maxBackoff": "1s",
                 "backoffMultiplier": 1, "retryableStatusCodes": ["{code}"]}}"#
        )
    };
    let c = ServiceConfig::from_json(&format!(
        r#"{{"methodConfig": [
            {{"name": [{{}}], "retryPolicy": {}}},
            {{"name": [{{"service": "a.S"}}], "retryPolicy": {}}},
            {{"name": [{{"service": "a.S", "method": "Get"}}, {{"service": "b.T", "method": "Put"}}],
              "retryPolicy": {}}}
        ]}}"#,
        policy(2, "UNAVAILABLE"),
        policy(3, "UNAVAILABLE"),
        policy(4, "UNAVAILABLE")
    ))
    .unwrap();
    let attempts = |path: &str| {
        c.method(path)
            .and_then(|m| m.retry_policy())
            .map(retries_tower::service_config::RetryPolicy::max_attempts)
    };
    assert_eq!(attempts("/a.S/Get"), Some(4));
    assert_eq!(attempts("/b.T/Put"), Some(4));
    assert_eq!(attempts("/a.S/List"), Some(3));
    assert_eq!(attempts("/b.T/Get"), Some(2));
    assert_eq!(attempts("not a path"), None);
}

/// Each invalid config and the JSON path its error must name.
const INVALID: &[(&str, &str)] = &[
    ("[]", ""),
    (r#"{"methodConfig": {}}"#, "methodConfig"),
    (r#"{"methodConfig": [3]}"#, "methodConfig[0]"),
    (
        r#"{"methodConfig": [{"name": {}}]}"#,
        "methodConfig[0].name",
    ),
    (
        r#"{"methodConfig": [{"name": [3]}]}"#,
        "methodConfig[0].name[0]",
    ),
    (
        r#"{"methodConfig": [{"name": [{"service": 3}]}]}"#,
        "methodConfig[0].name[0].service",
    ),
    (
        r#"{"methodConfig": [{"name": [{"method": "Get"}]}]}"#,
        "methodConfig[0].name[0].method",
    ),
    (
        r#"{"methodConfig": [{"name": [{"service": "s"}]}, {"name": [{"service": "s"}]}]}"#,
        "methodConfig[1].name[0]",
    ),
    (
        r#"{"methodConfig": [{"timeout": "1"}]}"#,
        "methodConfig[0].timeout",
    ),
    (
        r#"{"methodConfig": [{"timeout": 1}]}"#,
        "methodConfig[0].timeout",
    ),
    (
        r#"{"methodConfig": [{"timeout": "-1s"}]}"#,
        "methodConfig[0].timeout",
    ),
    // A zero timeout gave a policy that failed its own validation.
    (
        r#"{"methodConfig":[{"name":[{"service":"a.S"}],"timeout":"0s"}]}"#,
        "methodConfig[0].timeout",
    ),
    (
        r#"{"methodConfig": [{"timeout": "1.0000000001s"}]}"#,
        "methodConfig[0].timeout",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": 1}]}"#,
        "methodConfig[0].retryPolicy",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {}}]}"#,
        "methodConfig[0].retryPolicy.maxAttempts",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 1, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": [14]}}]}"#,
        "methodConfig[0].retryPolicy.maxAttempts",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 2.5, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": [14]}}]}"#,
        "methodConfig[0].retryPolicy.maxAttempts",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": "3", "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": [14]}}]}"#,
        "methodConfig[0].retryPolicy.maxAttempts",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 3, "maxBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": [14]}}]}"#,
        "methodConfig[0].retryPolicy.initialBackoff",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0s", "maxBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": [14]}}]}"#,
        "methodConfig[0].retryPolicy.initialBackoff",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 3, "initialBackoff": "1ms", "maxBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": [14]}}]}"#,
        "methodConfig[0].retryPolicy.initialBackoff",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 3, "initialBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": [14]}}]}"#,
        "methodConfig[0].retryPolicy.maxBackoff",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "0.0s", "backoffMultiplier": 1, "retryableStatusCodes": [14]}}]}"#,
        "methodConfig[0].retryPolicy.maxBackoff",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "1s", "retryableStatusCodes": [14]}}]}"#,
        "methodConfig[0].retryPolicy.backoffMultiplier",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 0, "retryableStatusCodes": [14]}}]}"#,
        "methodConfig[0].retryPolicy.backoffMultiplier",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": -2, "retryableStatusCodes": [14]}}]}"#,
        "methodConfig[0].retryPolicy.backoffMultiplier",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 1}}]}"#,
        "methodConfig[0].retryPolicy.retryableStatusCodes",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": []}}]}"#,
        "methodConfig[0].retryPolicy.retryableStatusCodes",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": "UNAVAILABLE"}}]}"#,
        "methodConfig[0].retryPolicy.retryableStatusCodes",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE", "SOMETIMES"]}}]}"#,
        "methodConfig[0].retryPolicy.retryableStatusCodes[1]",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": [17]}}]}"#,
        "methodConfig[0].retryPolicy.retryableStatusCodes[0]",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": [-1]}}]}"#,
        "methodConfig[0].retryPolicy.retryableStatusCodes[0]",
    ),
    (
        r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": [14]}, "hedgingPolicy": {"maxAttempts": 2}}]}"#,
        "methodConfig[0]",
    ),
    (
        r#"{"methodConfig": [{}, {"hedgingPolicy": {}}]}"#,
        "methodConfig[1].hedgingPolicy.maxAttempts",
    ),
    (
        r#"{"methodConfig": [{"hedgingPolicy": {"maxAttempts": 0}}]}"#,
        "methodConfig[0].hedgingPolicy.maxAttempts",
    ),
    (
        r#"{"methodConfig": [{"hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "soon"}}]}"#,
        "methodConfig[0].hedgingPolicy.hedgingDelay",
    ),
    (
        r#"{"methodConfig": [{"hedgingPolicy": {"maxAttempts": 3, "nonFatalStatusCodes": [true]}}]}"#,
        "methodConfig[0].hedgingPolicy.nonFatalStatusCodes[0]",
    ),
    (r#"{"retryThrottling": []}"#, "retryThrottling"),
    (
        r#"{"retryThrottling": {"tokenRatio": 0.1}}"#,
        "retryThrottling.maxTokens",
    ),
    (
        r#"{"retryThrottling": {"maxTokens": 0, "tokenRatio": 0.1}}"#,
        "retryThrottling.maxTokens",
    ),
    (
        r#"{"retryThrottling": {"maxTokens": 1001, "tokenRatio": 0.1}}"#,
        "retryThrottling.maxTokens",
    ),
    (
        r#"{"retryThrottling": {"maxTokens": 10.5, "tokenRatio": 0.1}}"#,
        "retryThrottling.maxTokens",
    ),
    (
        r#"{"retryThrottling": {"maxTokens": 10}}"#,
        "retryThrottling.tokenRatio",
    ),
    (
        r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0}}"#,
        "retryThrottling.tokenRatio",
    ),
    (
        r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": -0.5}}"#,
        "retryThrottling.tokenRatio",
    ),
    (
        r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.0004}}"#,
        "retryThrottling.tokenRatio",
    ),
    (
        r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": "0.1"}}"#,
        "retryThrottling.tokenRatio",
    ),
    ("not json", ""),
];

#[test]
fn every_invalid_config_is_rejected_at_its_path() {
    assert!(INVALID.len() >= 30);
    for (json, path) in INVALID {
        let err = ServiceConfig::from_json(json).expect_err(json);
        assert_eq!(err.path(), *path, "{json}: {err}");
        assert!(!err.problem().is_empty());
    }
}

/// What the inner service saw of each attempt: when, and its attempt header.
type Seen = Arc<Mutex<Vec<(Duration, Option<String>)>>>;

/// Answers trailers-only with `codes` in turn (then OK), pushback optional.
fn grpc(
    codes: Vec<(u16, Option<&'static str>)>,
    seen: Seen,
) -> impl Service<
    Request<tonic::body::Body>,
    Response = Response<tonic::body::Body>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    let t0 = Instant::now();
    let codes = Arc::new(codes);
    service_fn_grpc(move |r: &Request<tonic::body::Body>| {
        let mut seen = seen.lock().unwrap();
        let previous = r
            .headers()
            .get("grpc-previous-rpc-attempts")
            .map(|v| v.to_str().unwrap().to_string());
        seen.push((t0.elapsed(), previous));
        codes.get(seen.len() - 1).copied().unwrap_or((0, None))
    })
}

fn service_fn_grpc(
    answer: impl Fn(&Request<tonic::body::Body>) -> (u16, Option<&'static str>) + Clone + Send + 'static,
) -> impl Service<
    Request<tonic::body::Body>,
    Response = Response<tonic::body::Body>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |r: Request<tonic::body::Body>| {
        let (code, pushback) = answer(&r);
        let mut b = Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", code.to_string());
        if let Some(p) = pushback {
            b = b.header("grpc-retry-pushback-ms", p);
        }
        let response = b.body(tonic::body::Body::empty()).unwrap();
        async move { Ok::<_, BoxError>(response) }
    })
}

fn call(method: &str) -> Request<tonic::body::Body> {
    Request::builder()
        .uri(format!("http://payments{method}"))
        .body(tonic::body::Body::empty())
        .unwrap()
}

async fn send<S>(
    svc: &mut S,
    r: Request<tonic::body::Body>,
) -> Result<Response<tonic::body::Body>, BoxError>
where
    S: Service<
            Request<tonic::body::Body>,
            Response = Response<tonic::body::Body>,
            Error = BoxError,
        >,
{
    ServiceExt::<Request<tonic::body::Body>>::ready(svc)
        .await?
        .call(r)
        .await
}

fn status(r: &Response<tonic::body::Body>) -> &str {
    r.headers()["grpc-status"].to_str().unwrap()
}

const CAPPED: &str = r#"{
  "methodConfig": [
    {"name": [{"service": "payments.Payments", "method": "GetCharge"}],
     "retryPolicy": {"maxAttempts": 9, "initialBackoff": "0.1s", "maxBackoff": "0.3s",
                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "resource_exhausted"]}},
    {"name": [{"service": "payments.Payments", "method": "Ping"}], "timeout": "0.25s"}
  ]
}"#;

#[tokio::test(start_paused = true)]
async fn a_config_drives_the_layer_up_to_five_attempts_with_a6_backoff() {
    let seen = Seen::default();
    let layer = RetryLayer::grpc(Policy::new(Duration::from_secs(10)))
        .service_config(ServiceConfig::from_json(CAPPED).unwrap());
    let mut svc = layer.layer(grpc(vec![(14, None); 9], seen.clone()));
    let response = send(&mut svc, call("/payments.Payments/GetCharge"))
        .await
        .unwrap();
    assert_eq!(
        status(&response),
        "14",
        "the last UNAVAILABLE after 5 attempts"
    );
    let seen = seen.lock().unwrap().clone();
    let attempts: Vec<_> = seen.iter().map(|(_, p)| p.clone()).collect();
    assert_eq!(
        attempts,
        [
            None,
            Some("1".into()),
            Some("2".into()),
            Some("3".into()),
            Some("4".into())
        ]
    );
    // A6: the n-th pause is min(0.1 s · 2^(n−1), 0.3 s) · random(0.8, 1.2).
    let pauses: Vec<Duration> = seen
        .windows(2)
        .map(|w| w[1].0.saturating_sub(w[0].0))
        .collect();
    for (pause, nominal) in pauses.iter().zip([100u64, 200, 300, 300]) {
        let (lo, hi) = (
            Duration::from_millis(nominal * 8 / 10),
            Duration::from_millis(nominal * 12 / 10),
        );
        assert!(
            *pause >= lo && *pause <= hi,
            "{pause:?} not in [{lo:?}, {hi:?}]"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn only_the_listed_codes_are_retried_and_pushback_sets_the_pause() {
    let config = || ServiceConfig::from_json(CAPPED).unwrap();
    // INTERNAL is not listed: one attempt.
    let seen = Seen::default();
    let mut svc = RetryLayer::grpc(Policy::new(Duration::from_secs(10)))
        .service_config(config())
        .layer(grpc(vec![(13, None)], seen.clone()));
    let r = send(&mut svc, call("/payments.Payments/GetCharge"))
        .await
        .unwrap();
    assert_eq!((status(&r), seen.lock().unwrap().len()), ("13", 1));
    // Pushback: exactly the server's pause; a negative one stops.
    let seen = Seen::default();
    let mut svc = RetryLayer::grpc(Policy::new(Duration::from_secs(10)))
        .service_config(config())
        .layer(grpc(vec![(8, Some("750")), (14, Some("-1"))], seen.clone()));
    let r = send(&mut svc, call("/payments.Payments/GetCharge"))
        .await
        .unwrap();
    assert_eq!(status(&r), "14");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].0, Duration::from_millis(750));
}

#[tokio::test(start_paused = true)]
async fn a_method_without_a_retry_policy_is_not_retried_and_gets_its_timeout() {
    let seen = Seen::default();
    let mut svc = RetryLayer::grpc(Policy::new(Duration::from_secs(10)))
        .service_config(ServiceConfig::from_json(CAPPED).unwrap())
        .layer(grpc(vec![(14, None)], seen.clone()));
    let r = send(&mut svc, call("/payments.Payments/Ping"))
        .await
        .unwrap();
    assert_eq!((status(&r), seen.lock().unwrap().len()), ("14", 1));
    // Its timeout is the call's deadline, on the wire: 250 ms.
    let wire = Arc::new(Mutex::new(None));
    let w = wire.clone();
    let mut svc = RetryLayer::grpc(Policy::new(Duration::from_secs(10)))
        .service_config(ServiceConfig::from_json(CAPPED).unwrap())
        .layer(service_fn_grpc(move |r| {
            *w.lock().unwrap() = r
                .headers()
                .get("grpc-timeout")
                .map(|v| v.to_str().unwrap().to_string());
            (0, None)
        }));
    send(&mut svc, call("/payments.Payments/Ping"))
        .await
        .unwrap();
    assert_eq!(wire.lock().unwrap().as_deref(), Some("250000u"));
}

#[tokio::test(start_paused = true)]
async fn throttling_is_one_bucket_per_channel() {
    // 4 tokens: retries while more than 2 are left, whatever the method.
    let config = ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{"service": "s"}],
              "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
                              "backoffMultiplier": 1, "retryableStatusCodes": [14]}}],
            "retryThrottling": {"maxTokens": 4, "tokenRatio": 0.1}}"#,
    )
    .unwrap();
    let seen = Seen::default();
    let mut a = RetryLayer::grpc(Policy::new(Duration::from_secs(10)))
        .service_config(config)
        .layer(grpc(vec![(14, None); 10], seen.clone()));
    let mut b = a.clone();
    send(&mut a, call("/s/One")).await.unwrap();
    assert_eq!(
        seen.lock().unwrap().len(),
        2,
        "4 → 3 → 2 tokens: no third attempt"
    );
    send(&mut b, call("/s/Two")).await.unwrap();
    assert_eq!(
        seen.lock().unwrap().len(),
        3,
        "the other method, same channel: no retry"
    );
}

#[tokio::test(start_paused = true)]
async fn the_call_deadline_still_bounds_a_configured_method() {
    let seen = Seen::default();
    let mut svc = RetryLayer::grpc(Policy::new(Duration::from_millis(250)))
        .service_config(ServiceConfig::from_json(CAPPED).unwrap())
        .layer(grpc(vec![(14, None); 9], seen.clone()));
    let t0 = Instant::now();
    let response = send(&mut svc, call("/payments.Payments/GetCharge"))
        .await
        .unwrap();
    // Stopped before the deadline because the next pause cannot fit: the
    // caller gets the last status as it came (UNAVAILABLE), never a
    // DEADLINE_EXCEEDED while time is left.
    assert_eq!(status(&response), "14");
    // Attempts at 0 and after a pause of 80 to 120 ms; a third only if the
    // jittered second pause (160 to 240 ms) still fits in 250 ms.
    let n = seen.lock().unwrap().len();
    assert!((2..=3).contains(&n), "{n} attempts");
    assert!(t0.elapsed() < Duration::from_millis(250));
}

#[tokio::test(start_paused = true)]
async fn a_pushback_that_cannot_fit_returns_the_status_before_the_deadline() {
    // Pushbacks are not jittered: attempts at 0 and 100 ms exactly; the
    // second asks for 200 ms more, which cannot fit in the 150 ms left of
    // 250. The call ends at 100 ms with that UNAVAILABLE, not at 250 ms and
    // not as DEADLINE_EXCEEDED (A6: the status of the last attempt).
    let seen = Seen::default();
    let mut svc = RetryLayer::grpc(Policy::new(Duration::from_millis(250)))
        .service_config(ServiceConfig::from_json(CAPPED).unwrap())
        .layer(grpc(
            vec![(14, Some("100")), (14, Some("200"))],
            seen.clone(),
        ));
    let t0 = Instant::now();
    let response = send(&mut svc, call("/payments.Payments/GetCharge"))
        .await
        .unwrap();
    assert_eq!(status(&response), "14");
    assert_eq!(
        response.headers()["grpc-retry-pushback-ms"]
            .to_str()
            .unwrap(),
        "200"
    );
    let starts: Vec<Duration> = seen.lock().unwrap().iter().map(|s| s.0).collect();
    assert_eq!(starts, [Duration::ZERO, Duration::from_millis(100)]);
    assert_eq!(t0.elapsed(), Duration::from_millis(100));
}

const HEDGED: &str = r#"{
  "methodConfig": [{
    "name": [{"service": "payments.Payments", "method": "GetCharge"}],
    "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.05s", "nonFatalStatusCodes": ["UNAVAILABLE"]}
  }]
}"#;

/// Answers the `n`-th request (1-based) after `delays[n-1]` ms with
/// `codes[n-1]`, recording when each started and its attempt header.
fn slow_grpc(
    script: Vec<(u64, u16)>,
    seen: Seen,
) -> impl Service<
    Request<tonic::body::Body>,
    Response = Response<tonic::body::Body>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    let t0 = Instant::now();
    let script = Arc::new(script);
    tower::service_fn(move |r: Request<tonic::body::Body>| {
        let n = {
            let mut seen = seen.lock().unwrap();
            let previous = r
                .headers()
                .get("grpc-previous-rpc-attempts")
                .map(|v| v.to_str().unwrap().to_string());
            seen.push((t0.elapsed(), previous));
            seen.len()
        };
        let (delay, code) = script.get(n - 1).copied().unwrap_or((10_000, 0));
        async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let response = Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", code.to_string())
                .header("x-copy", n.to_string())
                .body(tonic::body::Body::empty())
                .unwrap();
            Ok::<_, BoxError>(response)
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_hedging_policy_sends_copies_and_the_first_answer_wins() {
    let seen = Seen::default();
    let mut svc = RetryLayer::grpc(Policy::new(Duration::from_secs(2)))
        .service_config(ServiceConfig::from_json(HEDGED).unwrap())
        .layer(slow_grpc(vec![(500, 0), (20, 0)], seen.clone()));
    let t0 = Instant::now();
    let r = send(&mut svc, call("/payments.Payments/GetCharge"))
        .await
        .unwrap();
    assert_eq!(r.headers()["x-copy"], "2", "the second copy answered first");
    assert_eq!(t0.elapsed(), Duration::from_millis(70));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            (Duration::ZERO, None),
            (Duration::from_millis(50), Some("1".into()))
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn hedges_follow_non_fatal_codes_and_stop_at_a_fatal_one() {
    // UNAVAILABLE is non-fatal: the next copy at once; INTERNAL is fatal.
    let seen = Seen::default();
    let mut svc = RetryLayer::grpc(Policy::new(Duration::from_secs(2)))
        .service_config(ServiceConfig::from_json(HEDGED).unwrap())
        .layer(slow_grpc(vec![(10, 14), (10, 13), (10, 0)], seen.clone()));
    let r = send(&mut svc, call("/payments.Payments/GetCharge"))
        .await
        .unwrap();
    assert_eq!(status(&r), "13", "the fatal answer ends the call");
    let starts: Vec<_> = seen.lock().unwrap().iter().map(|(t, _)| *t).collect();
    assert_eq!(starts, [Duration::ZERO, Duration::from_millis(10)]);
    // A request that says it is not idempotent is never hedged.
    let seen = Seen::default();
    let mut svc = RetryLayer::grpc(Policy::new(Duration::from_secs(2)))
        .service_config(ServiceConfig::from_json(HEDGED).unwrap())
        .layer(slow_grpc(vec![(500, 0)], seen.clone()));
    let mut request = call("/payments.Payments/GetCharge");
    request
        .extensions_mut()
        .insert(retries_tower::Idempotency(false));
    send(&mut svc, request).await.unwrap();
    assert_eq!(seen.lock().unwrap().len(), 1);
}

/// grpc-go's retry example config, as its README writes it: field names in
/// another case, a fraction without its leading zero.
#[test]
fn grpc_gos_example_config_parses() {
    let c = ServiceConfig::from_json(
        r#"{
            "methodConfig": [{
                "name": [{"service": "grpc.examples.echo.Echo"}],
                "waitForReady": true,
                "retryPolicy": {
                    "MaxAttempts": 4,
                    "InitialBackoff": ".01s",
                    "MaxBackoff": ".01s",
                    "BackoffMultiplier": 1.0,
                    "RetryableStatusCodes": [ "UNAVAILABLE" ]
                }
            }]
        }"#,
    )
    .unwrap();
    let r = c
        .method("/grpc.examples.echo.Echo/UnaryEcho")
        .unwrap()
        .retry_policy()
        .unwrap();
    assert_eq!(r.max_attempts(), 4);
    assert_eq!(r.backoff().initial(), Duration::from_millis(10));
    assert!(r.retryable_codes().contains(Code::Unavailable));
}

const UNTHROTTLED: &str = r#"{
  "methodConfig": [
    {"name": [{"service": "payments.Payments"}],
     "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
                     "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}
  ]
}"#;

/// gRFC A6: without `retryThrottling` a service config throttles nothing:
/// 25 failing calls make 25 × 3 attempts (the layer's default bucket made
/// 58). With `retryThrottling`, the bucket applies; and a layer built without
/// a config keeps its default bucket.
#[tokio::test(start_paused = true)]
async fn a_service_config_without_retry_throttling_throttles_nothing() {
    let attempts = |layer: RetryLayer<retries_tower::Grpc>| async move {
        let seen = Seen::default();
        let mut svc = layer.layer(grpc(vec![(14, None); 1000], seen.clone()));
        for _ in 0..25 {
            let r = send(&mut svc, call("/payments.Payments/GetCharge"))
                .await
                .unwrap();
            assert_eq!(status(&r), "14");
        }
        seen.lock().unwrap().len()
    };
    let unthrottled = RetryLayer::grpc(Policy::new(Duration::from_secs(10)))
        .service_config(ServiceConfig::from_json(UNTHROTTLED).unwrap());
    assert_eq!(attempts(unthrottled).await, 75);

    let throttled_json = UNTHROTTLED.replacen(
        '{',
        r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},"#,
        1,
    );
    let throttled = RetryLayer::grpc(Policy::new(Duration::from_secs(10)))
        .service_config(ServiceConfig::from_json(&throttled_json).unwrap());
    // 10 tokens: retries while more than 5 are left, each failure costs one.
    assert!(attempts(throttled).await < 40);

    let no_config = RetryLayer::grpc(Policy::new(Duration::from_secs(10)).with_max_attempts(3))
        .idempotent_methods(["/payments.Payments/GetCharge"]);
    assert!(
        attempts(no_config).await < 75,
        "the default bucket still applies"
    );
}

/// A budget that refuses every retry.
struct NoRetries;

impl retries::Budget for NoRetries {
    fn try_retry(&self) -> bool {
        false
    }
}

/// The attempts one failing call makes through `layer` (`GetCharge`, always
/// UNAVAILABLE).
async fn attempts_through<B: retries::Budget + Send + Sync + 'static>(
    layer: RetryLayer<retries_tower::Grpc, B>,
) -> usize {
    let seen = Seen::default();
    let mut svc = layer.layer(grpc(vec![(14, None); 9], seen.clone()));
    let response = send(&mut svc, call("/payments.Payments/GetCharge"))
        .await
        .unwrap();
    assert_eq!(status(&response), "14");
    seen.lock().unwrap().len()
}

#[tokio::test(start_paused = true)]
async fn a_budget_applies_whether_it_comes_before_or_after_the_service_config() {
    // CAPPED has no retryThrottling: alone it throttles nothing (5 attempts,
    // A6's cap); a budget given, before or after it, applies (1 attempt).
    let config = || ServiceConfig::from_json(CAPPED).unwrap();
    let policy = Policy::new(Duration::from_secs(10));
    let alone = RetryLayer::grpc(policy).service_config(config());
    assert_eq!(attempts_through(alone).await, 5);
    let before = RetryLayer::grpc(policy)
        .budget(NoRetries)
        .service_config(config());
    assert_eq!(attempts_through(before).await, 1);
    let after = RetryLayer::grpc(policy)
        .service_config(config())
        .budget(NoRetries);
    assert_eq!(attempts_through(after).await, 1);
}
