//! The metrics of calls and attempts, through a debugging recorder.

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use retries::testing::{Scripted, Step};
use retries::{Attempt, Backoff, Policy};

fn labels(k: &CompositeKey) -> Vec<(String, String)> {
    k.key()
        .labels()
        .map(|l| (l.key().to_string(), l.value().to_string()))
        .collect()
}

static STOCK: retries::observe::Name = retries::observe::Name::new("stock");

#[test]
fn calls_attempts_pauses_and_stops_are_counted_separately() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let policy = Policy::new(Duration::from_secs(1))
        .with_backoff(Backoff::constant(Duration::from_millis(100)));
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            // One call: two failures, then success.
            let op = Scripted::new([Step::fail_before_effect(), Step::fail_before_effect()]);
            retries::call(&policy)
                .name(&STOCK)
                .idempotent()
                .outcome(async |at: &Attempt| op.call(at).await)
                .await
                .unwrap();
            // One call stopped by its deadline.
            let op = Scripted::new([Step::hang()]);
            let _ = retries::call(&policy)
                .name(&STOCK)
                .idempotent()
                .outcome(async |at: &Attempt| op.call(at).await)
                .await;
        });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let find = |name: &str, extra: &[(&str, &str)]| {
        let found = snapshot.iter().find(|(k, _, _, _)| {
            let l = labels(k);
            k.key().name() == name
                && l.contains(&("function".into(), "stock".into()))
                && extra
                    .iter()
                    .all(|(a, b)| l.contains(&((*a).to_string(), (*b).to_string())))
        });
        let Some((k, _, _, v)) = found else {
            panic!("no {name} {extra:?}")
        };
        (k.kind(), v)
    };
    let counter = |name, extra| match find(name, extra) {
        (MetricKind::Counter, DebugValue::Counter(n)) => *n,
        other => panic!("{name}: {other:?}"),
    };
    let histogram = |name, extra| match find(name, extra) {
        (MetricKind::Histogram, DebugValue::Histogram(v)) => {
            v.iter().map(|x| x.into_inner()).collect::<Vec<f64>>()
        }
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(counter("retry.call.started", &[]), 2);
    assert_eq!(counter("retry.attempt.started", &[]), 4);
    assert_eq!(counter("retry.call.completed", &[("outcome", "ok")]), 1);
    assert_eq!(
        counter("retry.call.completed", &[("outcome", "deadline_exceeded")]),
        1
    );
    assert_eq!(
        counter(
            "retry.call.stopped_early",
            &[("reason", "deadline_exceeded")]
        ),
        1
    );
    assert_eq!(histogram("retry.pause.duration", &[]), [0.1, 0.1]);
    assert_eq!(histogram("retry.call.retries", &[]), [2.0, 0.0]);
    assert_eq!(
        histogram("retry.call.duration", &[("outcome", "deadline_exceeded")]),
        [1.0]
    );
    assert_eq!(
        histogram("retry.attempt.duration", &[("verdict", "cut_off")]),
        [1.0]
    );
    assert_eq!(
        histogram("retry.attempt.duration", &[("verdict", "not_executed")]).len(),
        2
    );
}

/// Labels, sorted.
type Labels = Vec<(String, String)>;
/// One instrument recorded: its name, its labels, its value.
type Seen = (String, Labels, DebugValue);
/// The answer of a scripted inner service.
type Answer = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<http::Response<()>, std::convert::Infallible>>
            + Send,
    >,
>;

/// Everything recorded while `f` runs on a paused current-thread runtime:
/// (name, labels sorted, the value).
fn recorded(f: impl AsyncFnOnce()) -> Vec<Seen> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || rt.block_on(f()));
    let mut all: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| {
            let mut l = labels(&k);
            l.sort();
            (k.key().name().to_string(), l, v)
        })
        .collect();
    all.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    all
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<_> = p
        .iter()
        .map(|(a, b)| ((*a).to_string(), (*b).to_string()))
        .collect();
    v.sort();
    v
}

/// The values of a histogram, or a counter's count as one value.
fn values(v: &DebugValue) -> Vec<f64> {
    match v {
        DebugValue::Histogram(h) => h.iter().map(|x| x.into_inner()).collect(),
        DebugValue::Counter(n) => vec![*n as f64],
        DebugValue::Gauge(g) => vec![g.into_inner()],
    }
}

/// The instruments recorded under `prefix`: (name, labels, values).
fn under(all: &[Seen], prefix: &str) -> Vec<(String, Labels, Vec<f64>)> {
    all.iter()
        .filter(|(n, _, _)| n.starts_with(prefix))
        .map(|(n, l, v)| (n.clone(), l.clone(), values(v)))
        .collect()
}

/// A layer whose inner service answers `statuses` in turn (a gRPC
/// trailers-only status when `grpc`), 10 ms each.
fn scripted<B>(
    statuses: Vec<(u16, Option<&'static str>)>,
) -> impl Fn(http::Request<B>) -> Answer + Clone {
    let next = std::sync::Arc::new(std::sync::Mutex::new(statuses.into_iter()));
    move |_r| {
        let (status, grpc) = next.lock().unwrap().next().unwrap_or((200, None));
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let mut response = http::Response::builder().status(status);
            if let Some(code) = grpc {
                response = response
                    .header("content-type", "application/grpc")
                    .header("grpc-status", code);
            }
            Ok(response.body(()).unwrap())
        })
    }
}

#[test]
fn the_http_layer_records_the_conventions_instrument_when_asked() {
    use retries::observe::MetricNames;
    use tower::{Service, ServiceExt};
    type Body = http_body_util::Empty<bytes::Bytes>;
    let policy = Policy::new(Duration::from_secs(2))
        .with_backoff(Backoff::constant(Duration::from_millis(100)));
    // HTTP: 503, then 200, under a route.
    let http = recorded(async || {
        let mut svc = retries_tower::RetryLayer::new(policy)
            .budget(retries::NoBudget)
            .route(|_| Some("/users/{id}"))
            .metric_names(MetricNames::OpenTelemetry)
            .layer(tower::service_fn(
                scripted::<retries_tower::ReplayBody<Body>>(vec![(503, None), (200, None)]),
            ));
        let request = http::Request::builder()
            .uri("http://users.internal/users/7")
            .body(Body::new())
            .unwrap();
        let r = svc.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(r.status(), 200);
    });
    // The time the call's deadline left it at entry: all of its 2 s.
    assert_eq!(
        under(&http, "retry.call.deadline_at_entry"),
        [(
            "retry.call.deadline_at_entry".to_string(),
            pairs(&[("function", "GET /users/{id}")]),
            vec![2.0]
        )]
    );
    let common = [
        ("http.request.method", "GET"),
        ("server.address", "users.internal"),
        ("url.template", "/users/{id}"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut all = common.to_vec();
        all.extend_from_slice(extra);
        pairs(&all)
    };
    assert_eq!(
        under(&http, "http."),
        [
            (
                "http.client.request.duration".to_string(),
                with(&[("error.type", "503"), ("http.response.status_code", "503")]),
                vec![0.01]
            ),
            (
                "http.client.request.duration".to_string(),
                with(&[("http.response.status_code", "200")]),
                vec![0.01]
            ),
        ]
    );
}

#[test]
fn the_grpc_layer_records_a66_and_a96_instruments_when_asked() {
    use retries::observe::MetricNames;
    use tower::{Service, ServiceExt};
    type Body = http_body_util::Empty<bytes::Bytes>;
    let policy = Policy::new(Duration::from_secs(2))
        .with_backoff(Backoff::constant(Duration::from_millis(100)));
    // gRPC: UNAVAILABLE (trailers-only), then a response.
    let grpc = recorded(async || {
        let mut svc = retries_tower::RetryLayer::grpc(policy)
            .idempotent_methods(["/inventory.Stock/"])
            .budget(retries::NoBudget)
            .metric_names(MetricNames::OpenTelemetry)
            .layer(tower::service_fn(scripted::<tonic::body::Body>(vec![
                (200, Some("14")),
                (200, None),
            ])));
        let request = http::Request::builder()
            .uri("/inventory.Stock/Get")
            .header("content-type", "application/grpc")
            .body(Body::new())
            .unwrap();
        let r = ServiceExt::<http::Request<Body>>::ready(&mut svc)
            .await
            .unwrap()
            .call(request)
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    });
    let method = ("grpc.method", "inventory.Stock/Get");
    assert_eq!(
        under(&grpc, "grpc."),
        [
            (
                "grpc.client.attempt.duration".to_string(),
                pairs(&[method, ("grpc.status", "OK")]),
                vec![0.01]
            ),
            (
                "grpc.client.attempt.duration".to_string(),
                pairs(&[method, ("grpc.status", "UNAVAILABLE")]),
                vec![0.01]
            ),
            (
                "grpc.client.attempt.started".to_string(),
                pairs(&[method]),
                vec![2.0]
            ),
            (
                "grpc.client.call.duration".to_string(),
                pairs(&[method, ("grpc.status", "OK")]),
                vec![0.12]
            ),
            (
                "grpc.client.call.retries".to_string(),
                pairs(&[method]),
                vec![1.0]
            ),
            (
                "grpc.client.call.retry_delay".to_string(),
                pairs(&[method]),
                vec![0.1]
            ),
        ]
    );
}

#[test]
fn a_layer_not_asked_records_only_this_crates_names() {
    use tower::{Service, ServiceExt};
    type Body = http_body_util::Empty<bytes::Bytes>;
    let policy = Policy::new(Duration::from_secs(2))
        .with_backoff(Backoff::constant(Duration::from_millis(100)));
    // Not asked: only this crate's names.
    let plain = recorded(async || {
        let mut svc = retries_tower::RetryLayer::new(policy)
            .budget(retries::NoBudget)
            .layer(tower::service_fn(
                scripted::<retries_tower::ReplayBody<Body>>(vec![(503, None)]),
            ));
        let request = http::Request::builder()
            .uri("http://users.internal/users/7")
            .body(Body::new())
            .unwrap();
        let _ = svc.ready().await.unwrap().call(request).await;
    });
    assert!(
        plain.iter().all(|(n, _, _)| n.starts_with("retry.")),
        "{plain:?}"
    );
    assert!(!plain.is_empty());
}

#[test]
fn a_call_stopped_before_its_first_attempt_and_a_server_short_of_time_are_counted() {
    use tower::{Service, ServiceExt};
    static OPEN: retries::CircuitBreaker = retries::CircuitBreaker::new(1, Duration::from_mins(1));
    static GUARDED: retries::observe::Name = retries::observe::Name::new("guarded");
    let all = recorded(async || {
        let policy = Policy::new(Duration::from_secs(1)).with_max_attempts(1);
        // The first call opens the breaker; the second is refused by it
        // before its first attempt.
        for _ in 0..2 {
            let _ = retries::call(&policy)
                .name(&GUARDED)
                .idempotent()
                .breaker(&OPEN)
                .outcome(async |_: &Attempt| {
                    Err::<(), _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
                })
                .await;
        }
        // A server layer: one request with 500 ms left, one with none to spare.
        let layer = retries_tower::ServerLayer::http().min_remaining(Duration::from_millis(50));
        let mut server = tower::Layer::layer(
            &layer,
            tower::service_fn(|_r: http::Request<()>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(()))
            }),
        );
        for ms in ["500", "20"] {
            let request = http::Request::builder()
                .header(retries::wire::TIMEOUT_MS, ms)
                .body(())
                .unwrap();
            let _ = server.ready().await.unwrap().call(request).await;
        }
    });
    let find = |name: &str| {
        under(&all, name)
            .into_iter()
            .map(|(_, l, v)| (l, v))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        find("retry.call.refused"),
        [(
            pairs(&[("function", "guarded"), ("reason", "circuit_open")]),
            vec![1.0]
        )]
    );
    assert_eq!(
        find("retry.server.deadline_at_entry"),
        [(vec![], vec![0.5, 0.02])]
    );
    assert_eq!(
        find("retry.server.refused"),
        [(pairs(&[("reason", "too_little_time")]), vec![1.0])]
    );
}

/// Faults injected and those that took effect, by kind
/// (`retry.chaos.injected`, `retry.chaos.observed`): a dropped reply whose
/// work failed by itself was injected but never took effect.
#[test]
fn injected_and_observed_faults_are_counted_by_kind() {
    use retries_chaos::{Chaos, Fault, Rule};
    type E = Box<dyn std::error::Error + Send + Sync>;
    let all = recorded(async || {
        let chaos = Chaos::builder()
            .rule(Rule::new(Fault::Delay(Duration::from_millis(10))))
            .rule(Rule::new(Fault::DropReply))
            .build()
            .unwrap();
        for _ in 0..3 {
            let r: Result<(), E> = chaos.around("work", async { Ok(()) }).await;
            assert!(r.is_err());
        }
        let r: Result<(), E> = chaos
            .around("work", async { Err("its own failure".into()) })
            .await;
        assert_eq!(r.unwrap_err().to_string(), "its own failure");
    });
    assert_eq!(
        under(&all, "retry.chaos"),
        vec![
            (
                "retry.chaos.injected".into(),
                pairs(&[("kind", "delay")]),
                vec![4.0]
            ),
            (
                "retry.chaos.injected".into(),
                pairs(&[("kind", "drop_reply")]),
                vec![4.0]
            ),
            (
                "retry.chaos.observed".into(),
                pairs(&[("kind", "delay")]),
                vec![4.0]
            ),
            (
                "retry.chaos.observed".into(),
                pairs(&[("kind", "drop_reply")]),
                vec![3.0]
            ),
        ]
    );
}

/// The look-ups a zero-sized recorder received (it has nowhere else to
/// keep them).
static LOOKED_UP: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// A recorder with no fields: `metrics`' own no-op recorder is one, so a
/// call takes it for "no recorder" unless told otherwise.
struct ZeroSized;

impl metrics::Recorder for ZeroSized {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        LOOKED_UP.lock().unwrap().push(key.name().to_owned());
        metrics::Counter::noop()
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        LOOKED_UP.lock().unwrap().push(key.name().to_owned());
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        LOOKED_UP.lock().unwrap().push(key.name().to_owned());
        metrics::Histogram::noop()
    }
}

#[test]
fn a_zero_sized_recorder_is_recorded_to_only_when_asked() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let policy = Policy::new(Duration::from_secs(1));
    let call = || {
        metrics::with_local_recorder(&ZeroSized, || {
            rt.block_on(async {
                retries::call(&policy)
                    .name(&STOCK)
                    .idempotent()
                    .outcome(async |_: &Attempt| Ok::<_, std::io::Error>(()))
                    .await
                    .unwrap();
            });
        });
        std::mem::take(&mut *LOOKED_UP.lock().unwrap())
    };
    // Taken for `metrics`' no-op recorder: nothing is looked up, no clock
    // is read for it.
    assert_eq!(call(), Vec::<String>::new());
    // Asked once (for the rest of the process, and no other test of this
    // binary uses a zero-sized recorder): the call's seven instruments.
    retries::observe::metrics_through_zero_sized_recorders();
    assert_eq!(
        call(),
        [
            "retry.call.started",
            "retry.attempt.started",
            "retry.call.deadline_at_entry",
            "retry.attempt.duration",
            "retry.call.completed",
            "retry.call.duration",
            "retry.call.retries",
        ]
    );
}
