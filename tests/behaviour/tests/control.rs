//! Operator control at run time (issue 60), through `retries::control` on
//! the paused clock: an override takes effect from the next call, reverts
//! at its time to live exactly, `unknown: stop` and `reconcile-only`,
//! shares, replacement policies, forced breakers that keep the breaker's
//! state, a reload that keeps a breaker open and a bucket's tokens, `*`,
//! hedges, and a watched file whose bad version changes nothing.
//!
//! Its own test binary: overrides are the process's, and `*` would reach
//! the other tests' calls; the tests here take turns (`TURN`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::sync::Mutex;

use retries::control::{self, ControlError, Force, Override, Unknown};
use retries::observe::Name;
use retries::{
    Attempt, Backoff, BreakerState, CircuitBreaker, Classify, Hedging, Policy, Reason, TokenBucket,
};

static TURN: Mutex<()> = Mutex::const_new(());

/// One test at a time, each starting with no override.
async fn turn() -> tokio::sync::MutexGuard<'static, ()> {
    let guard = TURN.lock().await;
    control::clear();
    guard
}

#[derive(Debug, thiserror::Error, Classify)]
enum E {
    #[error("refused")]
    #[classify(not_executed)]
    Refused,
    #[error("reply lost")]
    #[classify(unknown)]
    Lost,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

const POLICY: Policy = Policy::new(Duration::from_secs(10))
    .with_max_attempts(3)
    .with_backoff(Backoff::constant(Duration::from_millis(10)))
    .validated();

/// A call named `name` whose attempts fail with `fail` until the last
/// `max_attempts` allows; the attempts it made and how it ended.
async fn attempts(name: &'static Name, fail: fn() -> E) -> (u32, Result<u32, Reason>) {
    let n = AtomicU32::new(0);
    let r = retries::call(&POLICY)
        .name(name)
        .idempotent()
        .budget(retries::NoBudget)
        .outcome(async |at: &Attempt| {
            n.fetch_add(1, Ordering::Relaxed);
            if at.number() < 3 {
                Err(fail())
            } else {
                Ok(at.number())
            }
        })
        .await;
    (n.load(Ordering::Relaxed), r.map_err(|f| f.reason()))
}

#[tokio::test(start_paused = true)]
async fn an_override_takes_effect_from_the_next_call_and_reverts_exactly_at_its_ttl() {
    static CHARGE: Name = Name::new("control::charge");
    static OTHER: Name = Name::new("control::other");
    let _turn = turn().await;
    assert_eq!(attempts(&CHARGE, || E::Refused).await, (3, Ok(3)));
    control::set(
        "control::charge",
        Override::new().retries_off(),
        Duration::from_mins(10),
    )
    .unwrap();
    assert_eq!(
        attempts(&CHARGE, || E::Refused).await,
        (1, Err(Reason::Exhausted))
    );
    let listed = control::list();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].call.as_str(), listed[0].left),
        ("control::charge", Duration::from_mins(10))
    );
    // Another name is not touched.
    assert_eq!(attempts(&OTHER, || E::Refused).await, (3, Ok(3)));
    let left = control::list()[0].left;
    assert_eq!(
        left,
        Duration::from_millis(600_000 - 20),
        "the call above paused twice"
    );
    tokio::time::advance(left.saturating_sub(Duration::from_millis(1))).await;
    assert_eq!(
        attempts(&CHARGE, || E::Refused).await,
        (1, Err(Reason::Exhausted))
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    // Its time is up: reverted, for this call on.
    assert_eq!(attempts(&CHARGE, || E::Refused).await, (3, Ok(3)));
    assert!(control::list().is_empty());
}

#[tokio::test(start_paused = true)]
async fn unknown_stop_stops_an_idempotent_unknown_outcome_while_refusals_still_retry() {
    static PAY: Name = Name::new("control::pay");
    let _turn = turn().await;
    assert_eq!(
        attempts(&PAY, || E::Lost).await,
        (3, Ok(3)),
        "idempotent: resent"
    );
    control::set(
        "*",
        Override::new().unknown(Unknown::Stop),
        Duration::from_mins(1),
    )
    .unwrap();
    assert_eq!(
        attempts(&PAY, || E::Lost).await,
        (1, Err(Reason::UnknownOutcome))
    );
    assert_eq!(
        attempts(&PAY, || E::Refused).await,
        (3, Ok(3)),
        "refusals still retry"
    );

    // A call that is not idempotent: `reconcile` still runs, a found answer
    // is taken; "not done" stops under `stop` (it is sent again without
    // an override, and under `reconcile-only`).
    let run = async |found: Option<u32>| {
        let n = AtomicU32::new(0);
        let lookups = AtomicU32::new(0);
        let r = retries::call(&POLICY)
            .name(&PAY)
            .not_idempotent()
            .reconcile(async |_key| {
                lookups.fetch_add(1, Ordering::Relaxed);
                Ok::<_, E>(found)
            })
            .outcome(async |at: &Attempt| {
                n.fetch_add(1, Ordering::Relaxed);
                if at.number() < 3 {
                    Err(E::Lost)
                } else {
                    Ok(at.number())
                }
            })
            .await;
        (
            n.load(Ordering::Relaxed),
            lookups.load(Ordering::Relaxed),
            r.map_err(|f| f.reason()),
        )
    };
    assert_eq!(run(Some(7)).await, (1, 1, Ok(7)));
    assert_eq!(run(None).await, (1, 1, Err(Reason::UnknownOutcome)));
    control::remove("*");
    assert_eq!(run(None).await, (3, 2, Ok(3)), "without the override");
    control::set(
        "*",
        Override::new().unknown(Unknown::ReconcileOnly),
        Duration::from_mins(1),
    )
    .unwrap();
    assert_eq!(
        run(None).await,
        (3, 2, Ok(3)),
        "sent again after each \"not done\""
    );
    assert_eq!(
        attempts(&PAY, || E::Lost).await,
        (1, Err(Reason::UnknownOutcome)),
        "no reconcile: stops"
    );
}

#[tokio::test(start_paused = true)]
async fn an_override_of_its_own_wins_over_star_and_a_share_limits_who_retries() {
    static A: Name = Name::new("control::a");
    static B: Name = Name::new("control::b");
    let _turn = turn().await;
    control::set("*", Override::new().retries_off(), Duration::from_mins(1)).unwrap();
    control::set(
        "control::a",
        Override::new().share(100).unwrap(),
        Duration::from_mins(1),
    )
    .unwrap();
    assert_eq!(attempts(&A, || E::Refused).await, (3, Ok(3)));
    assert_eq!(
        attempts(&B, || E::Refused).await,
        (1, Err(Reason::Exhausted))
    );
    control::set(
        "control::a",
        Override::new().share(0).unwrap(),
        Duration::from_mins(1),
    )
    .unwrap();
    assert_eq!(
        attempts(&A, || E::Refused).await,
        (1, Err(Reason::Exhausted))
    );
    control::set(
        "control::a",
        Override::new().share(30).unwrap(),
        Duration::from_mins(1),
    )
    .unwrap();
    let mut retried = 0;
    for _ in 0..400 {
        if attempts(&A, || E::Refused).await.0 == 3 {
            retried += 1;
        }
    }
    assert!((80..=160).contains(&retried), "30 % of 400: {retried}");
    assert_eq!(Override::new().share(101), Err(ControlError::Share(101)));
    assert_eq!(
        control::set("", Override::new(), Duration::from_secs(1)),
        Err(ControlError::EmptyName)
    );
    assert_eq!(
        control::set("x", Override::new(), Duration::ZERO),
        Err(ControlError::Ttl(Duration::ZERO))
    );
}

#[tokio::test(start_paused = true)]
async fn a_replacement_policy_is_validated_and_replaces_the_calls_own() {
    static P: Name = Name::new("control::policy");
    let _turn = turn().await;
    let five = Policy::new(Duration::from_secs(10))
        .with_max_attempts(5)
        .with_backoff(Backoff::constant(Duration::from_millis(1)));
    let always = async || {
        let n = AtomicU32::new(0);
        let r = retries::call(&POLICY)
            .name(&P)
            .idempotent()
            .outcome(async |_: &Attempt| {
                n.fetch_add(1, Ordering::Relaxed);
                Err::<(), _>(E::Refused)
            })
            .await;
        (n.load(Ordering::Relaxed), r.unwrap_err().reason())
    };
    assert_eq!(always().await, (3, Reason::Exhausted));
    control::set(
        "control::policy",
        Override::new().policy(five).unwrap(),
        Duration::from_mins(1),
    )
    .unwrap();
    assert_eq!(always().await, (5, Reason::Exhausted));
    // Its deadline too: 50 ms, a pause of 20 ms: attempts at 0, 20 and
    // 40 ms, and the next would start past the deadline.
    let short = Policy::new(Duration::from_millis(50))
        .with_max_attempts(10)
        .with_backoff(Backoff::constant(Duration::from_millis(20)));
    control::set(
        "control::policy",
        Override::new().policy(short).unwrap(),
        Duration::from_mins(1),
    )
    .unwrap();
    let t0 = tokio::time::Instant::now();
    let (n, reason) = always().await;
    assert_eq!(n, 3);
    assert!(
        t0.elapsed() <= Duration::from_millis(50),
        "{:?} {reason:?}",
        t0.elapsed()
    );
    let bad = Policy::new(Duration::from_secs(1)).with_reserve(Duration::from_secs(2));
    assert!(matches!(
        Override::new().policy(bad),
        Err(ControlError::Policy(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn a_forced_breaker_and_a_reload_keep_the_breakers_state_and_the_buckets_tokens() {
    static BREAKER: CircuitBreaker = CircuitBreaker::new(2, Duration::from_secs(30));
    static BUCKET: TokenBucket = TokenBucket::new(10, 0.1);
    static K: Name = Name::new("control::breaker");
    let _turn = turn().await;
    let once = async |fail: bool| {
        let one = Policy::new(Duration::from_secs(10)).with_max_attempts(1);
        retries::call(&one)
            .name(&K)
            .idempotent()
            .breaker(&BREAKER)
            .budget(&BUCKET)
            .outcome(async |_: &Attempt| if fail { Err(E::Refused) } else { Ok(()) })
            .await
            .map_err(|f| f.reason())
    };
    // Forced open: refused, and the closed breaker is not told.
    control::set(
        "control::breaker",
        Override::new().breaker(Force::Open),
        Duration::from_mins(1),
    )
    .unwrap();
    assert_eq!(once(false).await, Err(Reason::CircuitOpen));
    assert!(matches!(BREAKER.state(), BreakerState::Closed { .. }));
    control::remove("control::breaker");
    // Two failures open it; a reload (another override) in the open
    // window keeps it open for the rest of the window, and the tokens.
    assert_eq!(once(true).await, Err(Reason::Exhausted));
    assert_eq!(once(true).await, Err(Reason::Exhausted));
    assert_eq!(BREAKER.state(), BreakerState::Open);
    let tokens = BUCKET.tokens_milli();
    tokio::time::advance(Duration::from_secs(10)).await;
    control::set(
        "*",
        Override::new().unknown(Unknown::Stop),
        Duration::from_mins(1),
    )
    .unwrap();
    control::set(
        "control::breaker",
        Override::new().retries_off(),
        Duration::from_mins(1),
    )
    .unwrap();
    assert_eq!(once(false).await, Err(Reason::CircuitOpen));
    assert_eq!(BUCKET.tokens_milli(), tokens, "the bucket kept its tokens");
    // Forced closed: admitted while the breaker stays open.
    control::set(
        "control::breaker",
        Override::new().breaker(Force::Closed),
        Duration::from_mins(1),
    )
    .unwrap();
    assert_eq!(once(false).await, Ok(()));
    assert_eq!(
        BREAKER.state(),
        BreakerState::Open,
        "a forced breaker is not told"
    );
    control::set(
        "control::breaker",
        Override::new().breaker(Force::Auto),
        Duration::from_mins(1),
    )
    .unwrap();
    assert_eq!(once(false).await, Err(Reason::CircuitOpen));
    tokio::time::advance(Duration::from_secs(20)).await;
    assert_eq!(
        once(false).await,
        Ok(()),
        "the window ended where it would have"
    );
}

#[tokio::test(start_paused = true)]
async fn retries_off_sends_no_hedge() {
    static H: Name = Name::new("control::hedged");
    let _turn = turn().await;
    let hedged = async || {
        let n = AtomicU32::new(0);
        let r = retries::call(&POLICY)
            .name(&H)
            .idempotent()
            .run_hedged(Hedging::new(3, Duration::from_millis(50)), |_: &Attempt| {
                n.fetch_add(1, Ordering::Relaxed);
                async {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok::<_, E>(())
                }
            })
            .await;
        assert!(r.is_ok());
        n.load(Ordering::Relaxed)
    };
    assert_eq!(hedged().await, 3);
    control::set(
        "control::hedged",
        Override::new().retries_off(),
        Duration::from_mins(1),
    )
    .unwrap();
    assert_eq!(hedged().await, 1);
}

#[tokio::test(start_paused = true)]
async fn a_watched_file_is_taken_a_bad_one_changes_nothing_and_the_next_good_one_is_taken() {
    static F: Name = Name::new("control::file");
    let _turn = turn().await;
    let path = std::env::temp_dir().join(format!("retries-control-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "[\"control::file\"]\nttl = \"10m\"\nretries = \"off\"\n",
    )
    .unwrap();
    let watch = control::watch(
        &path,
        |text| toml::from_str::<control::Overrides>(text),
        Duration::from_secs(1),
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(watch.last(), Some(Ok(1)));
    assert_eq!(
        attempts(&F, || E::Refused).await,
        (1, Err(Reason::Exhausted))
    );

    // A bad value: refused with the line and the call; the set stays.
    std::fs::write(
        &path,
        "[\"control::file\"]\nttl = \"10m\"\nretries = \"sometimes\"\n",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let Some(Err(ControlError::Parse { message, .. })) = watch.last() else {
        panic!("refused: {:?}", watch.last());
    };
    assert!(
        message.contains("line 1") || message.contains("line 3"),
        "{message}"
    );
    assert!(
        message.contains("control::file") && message.contains("sometimes"),
        "{message}"
    );
    assert_eq!(
        attempts(&F, || E::Refused).await,
        (1, Err(Reason::Exhausted)),
        "the last good set"
    );
    let left = control::list()[0].left;

    // The next good file: taken; an entry left as it was keeps its time.
    std::fs::write(
        &path,
        "[\"control::file\"]\nttl = \"10m\"\nretries = \"off\"\n\n[\"control::other-file\"]\nttl = \"1m\"\nunknown = \"stop\"\n",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(watch.last(), Some(Ok(2)));
    let listed = control::list();
    assert_eq!(listed.len(), 2);
    assert!(listed[0].left < left, "{listed:?}");
    // An entry removed from the file is removed.
    std::fs::write(
        &path,
        "[\"control::other-file\"]\nttl = \"1m\"\nunknown = \"stop\"\n",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(attempts(&F, || E::Refused).await, (3, Ok(3)));
    drop(watch);
    std::fs::remove_file(&path).unwrap();
}

/// The `control` field of the call spans recorded, in order.
#[derive(Clone, Default)]
struct Controlled(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Controlled {
    fn on_record(
        &self,
        _: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Field<'a>(&'a std::sync::Mutex<Vec<String>>);
        impl tracing::field::Visit for Field<'_> {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if field.name() == "control" {
                    self.0.lock().unwrap().push(value.to_owned());
                }
            }
            fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
        }
        values.record(&mut Field(&self.0));
    }
}

#[tokio::test(start_paused = true)]
async fn the_span_of_a_call_under_an_override_carries_it() {
    use tracing_subscriber::layer::SubscriberExt;
    static S: Name = Name::new("control::spanned");
    let _turn = turn().await;
    let seen = Controlled::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(seen.clone()));
    assert_eq!(attempts(&S, || E::Refused).await, (3, Ok(3)));
    assert!(seen.0.lock().unwrap().is_empty(), "no override, no field");
    control::set(
        "control::spanned",
        Override::new().unknown(Unknown::Stop).share(40).unwrap(),
        Duration::from_mins(1),
    )
    .unwrap();
    let _ = attempts(&S, || E::Refused).await;
    assert_eq!(
        *seen.0.lock().unwrap(),
        vec!["unknown=stop share=40%".to_owned()]
    );
}

#[tokio::test(start_paused = true)]
async fn the_files_example_of_the_docs_reads_and_every_change_is_counted() {
    let _turn = turn().await;
    let docs = r#"
["POST /charges"]
ttl = "10m"
retries = "off"
unknown = "stop"
share = 50
breaker = "open"

["inventory::stock"]
ttl = "30m"

["inventory::stock".policy]
deadline = "2s"
max_attempts = 2
"#;
    let read: control::Overrides = toml::from_str(docs).unwrap();
    assert_eq!(read.entries().len(), 2);
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        control::replace(&control::Source::Handle, read.entries()).unwrap();
        assert!(control::remove("POST /charges"));
    });
    let counted: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            (key.name() == "retry.control.changes").then(|| {
                let change = key
                    .labels()
                    .find(|l| l.key() == "change")
                    .unwrap()
                    .value()
                    .to_owned();
                (change, format!("{value:?}"))
            })
        })
        .collect();
    assert!(
        counted.contains(&("set".to_owned(), "Counter(2)".to_owned())),
        "{counted:?}"
    );
    assert!(
        counted.contains(&("removed".to_owned(), "Counter(1)".to_owned())),
        "{counted:?}"
    );
    let listed = control::list();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].what.replacement_policy().unwrap().max_attempts(),
        2
    );
}

/// The messages of the `retries::control` events, in order.
#[derive(Clone, Default)]
struct Told(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Told {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(Option<String>);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = Some(format!("{value:?}"));
                }
            }
        }
        if event.metadata().target() == "retries::control" {
            let mut m = Message(None);
            event.record(&mut m);
            self.0.lock().unwrap().extend(m.0);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_override_reverts_when_its_time_runs_out_and_says_so_then() {
    use tracing_subscriber::layer::SubscriberExt;
    let _turn = turn().await;
    let told = Told::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(told.clone()));
    control::set(
        "control::timed",
        Override::new().retries_off(),
        Duration::from_secs(5),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(4_999)).await;
    assert_eq!(*told.0.lock().unwrap(), vec!["override set".to_owned()]);
    // No call and no `list` in between: the runtime's timer reverts it.
    tokio::time::sleep(Duration::from_millis(1)).await;
    tokio::task::yield_now().await;
    assert_eq!(
        *told.0.lock().unwrap(),
        vec![
            "override set".to_owned(),
            "override expired: reverted".to_owned()
        ]
    );
    assert!(control::list().is_empty());
}
