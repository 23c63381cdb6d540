//! The tracing output of a call: one span, one event per attempt end, one for
//! the outcome, with the documented fields and levels, in order.

use crate::scoped;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use retries::{
    Attempt, Backoff, Classify, Policy, Verdict, retryable, testing::Scripted, testing::Step,
};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One thing seen: ("span" | "event", message or name, fields, parent span).
type Record = (String, String, Vec<(String, String)>, Option<String>);
/// Everything seen.
type Seen = Arc<Mutex<Vec<Record>>>;

#[derive(Default)]
struct Fields(Vec<(String, String)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .push((field.name().to_string(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_string(), value.to_string()));
    }
}

/// Keeps every span and event; a value recorded on a span later is added
/// to that span's fields.
struct Recorder(Seen, Mutex<std::collections::HashMap<u64, usize>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        attrs.record(&mut f);
        f.0.push(("level".into(), attrs.metadata().level().to_string()));
        let name = attrs.metadata().name().to_string();
        let parent = ctx
            .span(id)
            .and_then(|s| s.parent())
            .map(|p| p.name().to_string());
        let mut seen = self.0.lock().unwrap();
        self.1.lock().unwrap().insert(id.into_u64(), seen.len());
        seen.push(("span".into(), name, f.0, parent));
    }

    fn on_record(&self, id: &Id, values: &tracing::span::Record<'_>, _ctx: Context<'_, S>) {
        let mut f = Fields::default();
        values.record(&mut f);
        if let Some(&i) = self.1.lock().unwrap().get(&id.into_u64()) {
            self.0.lock().unwrap()[i].2.extend(f.0);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let message =
            f.0.iter()
                .position(|(k, _)| k == "message")
                .map(|i| f.0.remove(i).1)
                .unwrap_or_default();
        f.0.push(("level".into(), event.metadata().level().to_string()));
        let parent = ctx.event_span(event).map(|s| s.name().to_string());
        self.0
            .lock()
            .unwrap()
            .push(("event".into(), message, f.0, parent));
    }
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> &'a str {
    fields.iter().find(|(k, _)| k == name).map_or_else(
        || panic!("no field {name} in {fields:?}"),
        |(_, v)| v.as_str(),
    )
}

static STOCK: retries::observe::Name = retries::observe::Name::new("inventory::stock");

#[test]
fn one_span_one_event_per_attempt_and_one_outcome() {
    let policy = Policy::new(Duration::from_secs(2))
        .with_backoff(Backoff::constant(Duration::from_millis(100)));
    let op = Scripted::new([
        Step::fail_before_effect().after(Duration::from_millis(30)),
        Step::fail_after_effect(),
        Step::succeed(),
    ]);
    let seen = record(LevelFilter::TRACE, async || {
        retries::call(&policy)
            .name(&STOCK)
            .idempotent()
            .outcome(async |at: &Attempt| op.call(at).await)
            .await
            .unwrap();
    });
    let kinds: Vec<(&str, &str)> = seen
        .iter()
        .map(|(k, m, _, _)| (k.as_str(), m.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("span", "retries"),
            ("event", "attempt failed"),
            ("event", "attempt failed"),
            ("event", "attempt succeeded"),
            ("event", "call succeeded"),
        ]
    );
    let span = &seen[0].2;
    assert_eq!(field(span, "function"), "inventory::stock");
    assert_eq!(field(span, "idempotent"), "true");
    assert_eq!(field(span, "deadline_ms"), "2000.0");

    let a1 = &seen[1].2;
    assert_eq!(field(a1, "attempt"), "1");
    assert_eq!(field(a1, "verdict"), "not_executed");
    assert_eq!(field(a1, "duration_ms"), "30.0");
    assert_eq!(field(a1, "next"), "retry");
    assert_eq!(field(a1, "pause_ms"), "100.0");
    assert_eq!(field(a1, "remaining_ms"), "1970.0");
    let a2 = &seen[2].2;
    assert_eq!(
        (field(a2, "attempt"), field(a2, "verdict")),
        ("2", "unknown")
    );
    assert_eq!(field(a2, "remaining_ms"), "1870.0");
    let a3 = &seen[3].2;
    assert_eq!(
        (
            field(a3, "attempt"),
            field(a3, "verdict"),
            field(a3, "next")
        ),
        ("3", "ok", "done")
    );
    let end = &seen[4].2;
    assert_eq!(field(end, "outcome"), "ok");
    assert_eq!(field(end, "attempts"), "3");
    assert_eq!(field(end, "elapsed_ms"), "230.0");
    // Every event belongs to the call's span.
    assert!(
        seen[1..]
            .iter()
            .all(|(_, _, _, parent)| parent.as_deref() == Some("retries"))
    );
}

/// The value of `name` last recorded in `fields`.
fn last<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn each_attempt_has_a_span_of_its_own_under_the_call() {
    let policy = Policy::new(Duration::from_secs(2))
        .with_backoff(Backoff::constant(Duration::from_millis(100)));
    let op = Scripted::new([
        Step::fail_before_effect(),
        Step::fail_after_effect(),
        Step::succeed(),
    ]);
    let seen = record_all(LevelFilter::TRACE, async || {
        retries::call(&policy)
            .name(&STOCK)
            .idempotent()
            .outcome(async |at: &Attempt| {
                // The body runs in its attempt's span.
                let current = tracing::Span::current();
                assert_eq!(
                    current.metadata().map(tracing::Metadata::name),
                    Some("attempt")
                );
                op.call(at).await
            })
            .await
            .unwrap();
    });
    let spans: Vec<&Record> = seen.iter().filter(|r| r.0 == "span").collect();
    let names: Vec<(&str, Option<&str>)> = spans
        .iter()
        .map(|(_, n, _, p)| (n.as_str(), p.as_deref()))
        .collect();
    assert_eq!(
        names,
        [
            ("retries", None),
            ("attempt", Some("retries")),
            ("attempt", Some("retries")),
            ("attempt", Some("retries")),
        ]
    );
    let attempt = |i: usize, name: &str| last(&spans[i].2, name).map(str::to_owned);
    let got: Vec<[Option<String>; 5]> = (1..4)
        .map(|i| {
            [
                attempt(i, "attempt"),
                attempt(i, "verdict"),
                attempt(i, "next"),
                attempt(i, "pause_ms"),
                attempt(i, "otel.status_code"),
            ]
        })
        .collect();
    let s = |v: &str| Some(v.to_owned());
    assert_eq!(
        got,
        [
            [
                s("1"),
                s("not_executed"),
                s("retry"),
                s("100.0"),
                s("ERROR")
            ],
            [s("2"), s("unknown"), s("retry"), s("100.0"), s("ERROR")],
            [s("3"), s("ok"), s("done"), s("0.0"), None],
        ]
    );
    // The call's span carries the time left at entry, the outcome and the
    // attempts.
    assert_eq!(last(&spans[0].2, "remaining_at_entry_ms"), Some("2000.0"));
    assert_eq!(last(&spans[0].2, "outcome"), Some("ok"));
    assert_eq!(last(&spans[0].2, "attempts"), Some("3"));
    // Nothing listens at INFO: no span at all, attempts' included.
    let quiet = record_all(LevelFilter::INFO, async || {
        retries::call(&policy)
            .idempotent()
            .outcome(async |_: &Attempt| Ok::<_, std::io::Error>(()))
            .await
            .unwrap();
    });
    assert!(quiet.is_empty(), "{quiet:?}");
}

#[test]
fn the_tower_layer_names_each_attempt_by_the_conventions() {
    use tower::{Service, ServiceExt};
    type Body = http_body_util::Empty<bytes::Bytes>;
    let all = record_all(LevelFilter::TRACE, async || {
        let mut statuses = vec![503u16, 200].into_iter();
        let mut svc = retries_tower::RetryLayer::new(
            Policy::new(Duration::from_secs(2))
                .with_backoff(Backoff::constant(Duration::from_millis(10))),
        )
        .budget(retries::NoBudget)
        .route(|_| Some("/users/{id}"))
        .layer(tower::service_fn(
            move |_r: http::Request<retries_tower::ReplayBody<Body>>| {
                let status = statuses.next().unwrap_or(200);
                async move {
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder().status(status).body(()).unwrap(),
                    )
                }
            },
        ));
        let request = http::Request::builder()
            .uri("http://users.internal:8080/users/7")
            .body(Body::new())
            .unwrap();
        let r = svc.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(r.status(), 200);
    });
    let attempts: Vec<&Record> = all
        .iter()
        .filter(|(kind, name, _, _)| kind == "span" && name == "attempt")
        .collect();
    assert_eq!(attempts.len(), 2, "{all:?}");
    let get = |i: usize, name: &str| last(&attempts[i].2, name).map(str::to_owned);
    let fields = [
        "otel.name",
        "otel.kind",
        "http.request.method",
        "server.address",
        "url.template",
        "http.response.status_code",
        "http.request.resend_count",
        "error.type",
    ];
    let s = |v: &str| Some(v.to_owned());
    assert_eq!(
        fields.map(|f| get(0, f)),
        [
            s("GET /users/{id}"),
            s("client"),
            s("GET"),
            s("users.internal"),
            s("/users/{id}"),
            s("503"),
            None,
            s("503"),
        ]
    );
    assert_eq!(
        fields.map(|f| get(1, f)),
        [
            s("GET /users/{id}"),
            s("client"),
            s("GET"),
            s("users.internal"),
            s("/users/{id}"),
            s("200"),
            s("1"),
            None,
        ]
    );
}

#[test]
fn a_failed_call_reports_its_reason() {
    let policy = Policy::new(Duration::from_millis(500));
    let op = Scripted::new([Step::hang()]);
    let seen = record(LevelFilter::TRACE, async || {
        let f = retries::call(&policy)
            .not_idempotent()
            .outcome(async |at: &Attempt| op.call(at).await)
            .await
            .unwrap_err();
        assert_eq!(f.reason(), retries::Reason::DeadlineExceeded);
    });
    let (_, message, fields, _) = seen.last().unwrap();
    assert_eq!(message, "call failed");
    assert_eq!(field(fields, "outcome"), "deadline_exceeded");
    assert_eq!(field(fields, "elapsed_ms"), "500.0");
    let (_, message, fields, _) = &seen[seen.len() - 2];
    assert_eq!(message, "attempt failed");
    assert_eq!(
        (field(fields, "verdict"), field(fields, "next")),
        ("cut_off", "stop")
    );
}

#[test]
fn next_says_what_really_follows_an_unknown_outcome() {
    // Not idempotent, the work may have happened: without `reconcile` the
    // call stops (`next` = "stop"), with one it asks first ("reconcile").
    let policy = Policy::new(Duration::from_millis(500));
    let next_after = |with_reconcile: bool| {
        let op = Scripted::new([Step::fail_after_effect(), Step::succeed()]);
        let seen = record(LevelFilter::TRACE, async || {
            let spec = retries::call(&policy).not_idempotent();
            let body = async |at: &Attempt| op.call(at).await;
            if with_reconcile {
                let r = spec
                    .reconcile(async |_| Ok::<_, retries::testing::ScriptError>(None))
                    .outcome(body)
                    .await;
                assert!(r.is_ok(), "not found, so retried, then done");
            } else {
                let f = spec.outcome(body).await.unwrap_err();
                assert_eq!(f.reason(), retries::Reason::UnknownOutcome);
            }
        });
        let (_, _, fields, _) = seen
            .iter()
            .find(|(_, message, _, _)| message == "attempt failed")
            .expect("an attempt failed");
        (
            field(fields, "verdict").to_owned(),
            field(fields, "next").to_owned(),
        )
    };
    assert_eq!(next_after(false), ("unknown".to_owned(), "stop".to_owned()));
    assert_eq!(
        next_after(true),
        ("unknown".to_owned(), "reconcile".to_owned())
    );
}

#[derive(Debug, thiserror::Error)]
enum Quiet {
    #[error("refused")]
    Refused,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

impl Classify for Quiet {
    fn classify(&self) -> Verdict {
        match self {
            Quiet::Refused => Verdict::not_executed(),
            Quiet::Stopped(_) => Verdict::permanent(),
        }
    }
}

#[retryable(
    deadline = "1s",
    max_attempts = 3,
    idempotent,
    backoff = "constant",
    initial_backoff = "10ms"
)]
async fn fails_first(n: u32) -> Result<u32, Quiet> {
    if n == 0 { Err(Quiet::Refused) } else { Ok(n) }
}

/// Run `f` on a paused current-thread runtime under a recorder that keeps
/// what passes `filter`, but for the attempts' spans (see
/// [`record_all`]).
fn record(filter: LevelFilter, f: impl AsyncFnOnce()) -> Vec<Record> {
    let mut all = record_all(filter, f);
    all.retain(|(kind, name, _, _)| !(kind == "span" && name == "attempt"));
    all
}

/// Run `f` as [`record`] does, and keep the attempts' spans too.
fn record_all(filter: LevelFilter, f: impl AsyncFnOnce()) -> Vec<Record> {
    let seen: Seen = Arc::default();
    let subscriber = tracing_subscriber::registry()
        .with(Recorder(seen.clone(), Mutex::default()).with_filter(filter));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    scoped::with_scoped(subscriber, || rt.block_on(f()));
    seen.lock().unwrap().clone()
}

/// The records at WARN.
fn at_warn(all: &[Record]) -> Vec<&Record> {
    all.iter()
        .filter(|(_, _, fields, _)| field(fields, "level") == "WARN")
        .collect()
}

#[test]
fn a_first_attempt_success_emits_nothing_above_debug() {
    // Everything that is emitted is at DEBUG …
    let all = record(LevelFilter::TRACE, async || {
        assert_eq!(fails_first(7).await.unwrap(), 7);
    });
    // The call's span and its outcome; the attempt's event would only
    // repeat the outcome's (attempt 1, `ok`, `done`, no pause).
    let kinds: Vec<(&str, &str)> = all
        .iter()
        .map(|(k, m, _, _)| (k.as_str(), m.as_str()))
        .collect();
    assert_eq!(kinds, [("span", "retries"), ("event", "call succeeded")]);
    assert!(
        all.iter()
            .all(|(_, _, fields, _)| field(fields, "level") == "DEBUG"),
        "{all:?}"
    );
    // … so a subscriber at INFO sees nothing at all.
    let info = record(LevelFilter::INFO, async || {
        assert_eq!(fails_first(7).await.unwrap(), 7);
    });
    assert!(info.is_empty(), "{info:?}");
}

#[test]
fn a_call_that_retried_and_succeeded_is_one_info_event() {
    let policy = Policy::new(Duration::from_secs(2))
        .with_backoff(Backoff::constant(Duration::from_millis(100)));
    let call = async || {
        let op = Scripted::new([Step::fail_before_effect(), Step::succeed()]);
        retries::call(&policy)
            .name(&STOCK)
            .idempotent()
            .outcome(async |at: &Attempt| op.call(at).await)
            .await
            .unwrap();
    };
    // A subscriber at INFO (no DEBUG span) gets one event, named, with
    // the attempts it took …
    let info = record_all(LevelFilter::INFO, call);
    assert_eq!(info.len(), 1, "{info:?}");
    let (kind, message, fields, parent) = &info[0];
    assert_eq!(
        (kind.as_str(), message.as_str()),
        ("event", "call succeeded")
    );
    assert_eq!(field(fields, "level"), "INFO");
    assert_eq!(field(fields, "function"), "inventory::stock");
    assert_eq!(field(fields, "outcome"), "ok");
    assert_eq!(field(fields, "attempts"), "2");
    assert_eq!(field(fields, "elapsed_ms"), "100.0");
    assert_eq!(parent, &None);
    // … and at DEBUG it is the same event, at INFO, inside the call's span;
    // everything else stays at DEBUG.
    let all = record(LevelFilter::TRACE, call);
    let levels: Vec<(&str, &str)> = all
        .iter()
        .map(|(_, m, f, _)| (m.as_str(), field(f, "level")))
        .collect();
    assert_eq!(
        levels,
        [
            ("retries", "DEBUG"),
            ("attempt failed", "DEBUG"),
            ("attempt succeeded", "DEBUG"),
            ("call succeeded", "INFO"),
        ]
    );
    assert_eq!(all[3].3.as_deref(), Some("retries"));
}

#[test]
fn a_call_that_gives_up_emits_exactly_one_warn() {
    let all = record(LevelFilter::TRACE, async || {
        assert!(matches!(fails_first(0).await, Err(Quiet::Refused)));
    });
    let warns = at_warn(&all);
    assert_eq!(warns.len(), 1, "{all:?}");
    let (kind, message, fields, _) = warns[0];
    assert_eq!((kind.as_str(), message.as_str()), ("event", "call failed"));
    assert_eq!(field(fields, "outcome"), "exhausted");
    assert!(field(fields, "function").ends_with("::fails_first"));
    assert_eq!(field(fields, "attempts"), "3");
    // Nothing else rises above DEBUG: the retries themselves are DEBUG.
    assert!(
        all.iter()
            .all(|(_, _, f, _)| matches!(field(f, "level"), "DEBUG" | "WARN"))
    );
    // A subscriber at INFO (no DEBUG span) still gets the one WARN, named.
    let info = record(LevelFilter::INFO, async || {
        assert!(fails_first(0).await.is_err());
    });
    assert_eq!(info.len(), 1, "{info:?}");
    assert_eq!(info[0].1, "call failed");
    assert!(field(&info[0].2, "function").ends_with("::fails_first"));
}

static LOOSE: retries::observe::Name = retries::observe::Name::new("observe_tracing::loose");
static LOW: retries::CircuitBreaker = retries::CircuitBreaker::new(2, Duration::from_secs(1));

#[test]
fn a_misconfiguration_known_only_at_run_time_is_one_warn_once() {
    // Built at run time from configuration: `max_attempts = 0` and a breaker
    // that one call could open. The engine runs them (0 acts as 1) and says so
    // once each, as a WARN event; nothing is printed.
    let attempts = std::hint::black_box(0);
    let policy = Policy::new(Duration::from_secs(1)).with_max_attempts(attempts);
    let all = record(LevelFilter::TRACE, async || {
        for _ in 0..3 {
            let r: Result<u32, Quiet> = retries::call(&policy)
                .name(&LOOSE)
                .idempotent()
                .breaker(&LOW)
                .run(async |at: &Attempt| Ok(at.number()))
                .await;
            assert_eq!(r.unwrap(), 1);
        }
    });
    let warns = at_warn(&all);
    assert_eq!(warns.len(), 1, "{all:?}");
    assert_eq!(field(&warns[0].2, "what"), "policy");
    assert!(field(&warns[0].2, "rule").starts_with("`max_attempts` must be at least 1"));
    assert!(field(&warns[0].2, "detail").contains("observe_tracing::loose"));

    // The breaker's rule, under a loop of 3 attempts.
    let policy = Policy::new(Duration::from_secs(1));
    let all = record(LevelFilter::TRACE, async || {
        for _ in 0..2 {
            let r: Result<u32, Quiet> = retries::call(&policy)
                .idempotent()
                .breaker(&LOW)
                .run(async |_: &Attempt| Ok(1))
                .await;
            assert!(r.is_ok());
        }
    });
    let warns = at_warn(&all);
    assert_eq!(warns.len(), 1, "{all:?}");
    assert_eq!(field(&warns[0].2, "what"), "circuit breaker");
    assert!(field(&warns[0].2, "detail").contains("failure_threshold = 2 under max_attempts = 3"));
    assert!(LOW.misconfiguration_reported());
}

/// The tower layer reports through the same engine: a request that succeeds
/// at once emits nothing above DEBUG; one that gives up, one WARN, named
/// after the layer.
#[test]
fn the_tower_layer_reports_like_the_macro() {
    use tower::{Service, ServiceExt};
    type Body = http_body_util::Empty<bytes::Bytes>;
    fn get() -> http::Request<Body> {
        http::Request::builder()
            .uri("http://x/")
            .body(Body::new())
            .unwrap()
    }
    let service = |status: u16| {
        retries_tower::RetryLayer::new(Policy::new(Duration::from_secs(2)))
            .budget(retries::NoBudget)
            .layer(tower::service_fn(
                move |_r: http::Request<retries_tower::ReplayBody<Body>>| async move {
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder().status(status).body(()).unwrap(),
                    )
                },
            ))
    };
    let info = record(LevelFilter::INFO, async || {
        let mut ok = service(200);
        ok.ready().await.unwrap().call(get()).await.unwrap();
    });
    assert!(info.is_empty(), "{info:?}");
    let all = record(LevelFilter::TRACE, async || {
        let mut busy = service(503);
        let r = busy.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(r.status(), 503);
    });
    let warns = at_warn(&all);
    assert_eq!(warns.len(), 1, "{all:?}");
    assert_eq!(field(&warns[0].2, "function"), "retries::tower");
    assert_eq!(field(&warns[0].2, "outcome"), "exhausted");
    assert_eq!(field(&warns[0].2, "attempts"), "3");
}

/// A request whose body passed the replay cap is not retried, and a DEBUG
/// event says why.
#[test]
fn the_tower_layer_says_why_a_request_was_not_retried() {
    use http_body_util::BodyExt;
    use tower::{Service, ServiceExt};
    type Body = http_body_util::Full<bytes::Bytes>;
    let all = record(LevelFilter::TRACE, async || {
        let mut svc = retries_tower::RetryLayer::new(Policy::new(Duration::from_secs(2)))
            .budget(retries::NoBudget)
            .body_cap(4)
            .layer(tower::service_fn(
                |r: http::Request<retries_tower::ReplayBody<Body>>| async move {
                    let _ = r.into_body().collect().await; // the body is sent
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder().status(503).body(()).unwrap(),
                    )
                },
            ));
        let request = http::Request::builder()
            .method("PUT")
            .uri("http://x/")
            .body(Body::new(bytes::Bytes::from_static(b"ten bytes!")))
            .unwrap();
        let response = svc.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(response.status(), 503);
    });
    let not_retried: Vec<_> = all
        .iter()
        .filter(|(_, message, _, _)| message == "request not retried")
        .collect();
    assert_eq!(not_retried.len(), 1, "{all:?}");
    let fields = &not_retried[0].2;
    assert_eq!(field(fields, "level"), "DEBUG");
    assert_eq!(field(fields, "door"), "http");
    assert!(
        field(fields, "detail").contains("replay cap of 4 bytes (10 bytes sent)"),
        "{fields:?}"
    );
    // When the cap was passed, during the attempt: one DEBUG event.
    let passed: Vec<_> = all
        .iter()
        .filter(|(_, message, _, _)| message.starts_with("request body passed the replay cap"))
        .collect();
    assert_eq!(passed.len(), 1, "{all:?}");
    assert_eq!(field(&passed[0].2, "level"), "DEBUG");
    assert_eq!(field(&passed[0].2, "detail"), "cap 4 bytes");
    // And the call made one attempt only.
    let attempts = all
        .iter()
        .filter(|(_, message, _, _)| message.starts_with("attempt "))
        .count();
    assert_eq!(attempts, 1, "{all:?}");
}

/// The layer's WARN names the call: a gRPC call by its method path, an HTTP
/// call by its method and the route the user gave (an extension, or the
/// layer's `route`), never by the raw path; without a route, the layer's
/// name.
#[test]
fn the_layer_names_the_grpc_method_and_the_http_route_in_its_warn() {
    use tower::{Service, ServiceExt};
    type Body = http_body_util::Empty<bytes::Bytes>;
    let grpc = record(LevelFilter::WARN, async || {
        let mut svc = retries_tower::RetryLayer::grpc(Policy::new(Duration::from_secs(2)))
            .idempotent_methods(["/payments.Payments/"])
            .budget(retries::NoBudget)
            .layer(tower::service_fn(
                |_r: http::Request<tonic::body::Body>| async {
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder()
                            .header("grpc-status", "14")
                            .body(())
                            .unwrap(),
                    )
                },
            ));
        let request = http::Request::builder()
            .uri("http://payments/payments.Payments/GetCharge")
            .body(tonic::body::Body::empty())
            .unwrap();
        let _ = ServiceExt::<http::Request<tonic::body::Body>>::ready(&mut svc)
            .await
            .unwrap()
            .call(request)
            .await;
    });
    assert_eq!(grpc.len(), 1, "{grpc:?}");
    assert_eq!(
        field(&grpc[0].2, "function"),
        "/payments.Payments/GetCharge"
    );

    let http = record(LevelFilter::WARN, async || {
        let mut svc = retries_tower::RetryLayer::new(Policy::new(Duration::from_secs(2)))
            .budget(retries::NoBudget)
            .route(|parts| {
                parts
                    .uri
                    .path()
                    .starts_with("/orders/")
                    .then_some("/orders/{id}")
            })
            .layer(tower::service_fn(
                |_r: http::Request<retries_tower::ReplayBody<Body>>| async {
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder().status(503).body(()).unwrap(),
                    )
                },
            ));
        let mut by_extension = http::Request::builder()
            .uri("http://x/users/42")
            .body(Body::new())
            .unwrap();
        by_extension
            .extensions_mut()
            .insert(retries_tower::Route("/users/{id}"));
        let _ = svc.ready().await.unwrap().call(by_extension).await;
        let by_closure = http::Request::builder()
            .method("DELETE")
            .uri("http://x/orders/7")
            .body(Body::new())
            .unwrap();
        let _ = svc.ready().await.unwrap().call(by_closure).await;
        let unnamed = http::Request::builder()
            .uri("http://x/health/9")
            .body(Body::new())
            .unwrap();
        let _ = svc.ready().await.unwrap().call(unnamed).await;
    });
    let names: Vec<&str> = http.iter().map(|r| field(&r.2, "function")).collect();
    assert_eq!(
        names,
        ["GET /users/{id}", "DELETE /orders/{id}", "retries::tower"]
    );
}
