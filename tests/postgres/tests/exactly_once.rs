//! The server half of exactly-once across processes, against a real
//! PostgreSQL: three `charge_server` processes sharing one database, a
//! client spreading 1,000 charge calls over them (the tower `RetryLayer`,
//! `idempotent_by_key`, `avoid_tried` over `balance::P2c`), `FaultLayer`
//! with every kind of fault (20 % of replies dropped after the charge, 5 %
//! failed after it, 5 % refused, 5 % delayed, 2 % hung), one charge in
//! twenty slower than the client's attempt (which sends the key again while
//! the first still runs), and one replica killed with `SIGKILL` mid-run and
//! started again on its port.
//!
//! Beside it, in a test of its own (the two run side by side), the same
//! load against a handler that caches its answer after the charge (the
//! pattern of the crates that exist) and against no deduplication. The figures `tests/bench/README.md` shows are
//! this test's output (`cargo test -p retries-postgres-tests --test
//! postgres exactly_once -- --nocapture`).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use retries::{Backoff, NoBudget, Policy};
use retries_postgres_tests::Cluster;
use retries_tower::ReplayBody;
use retries_tower::RetryLayer;
use retries_tower::balance::{At, P2c};
use sqlx::postgres::PgPoolOptions;
use tower::ServiceExt;
use tower::discover::ServiceList;

const CALLS: usize = 1000;
const IN_FLIGHT: usize = 16;
/// The call after which replica 1 is killed.
const KILL_AT: usize = 300;

/// A replica's process, killed when dropped (a failing test leaves none).
struct Replica {
    child: Child,
    port: u16,
}

impl Replica {
    fn start(url: &str, port: u16, mode: &str, seed: u64) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_charge_server"))
            .args([url, &port.to_string(), mode, &seed.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the charge server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("its stdout"))
            .read_line(&mut line)
            .expect("its first line");
        let port = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the server said {line:?}"));
        Self { child, port }
    }

    fn kill(&mut self) {
        // SIGKILL: no shutdown, no flush, the transactions in flight cut.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What one mode's run gave.
#[derive(Debug)]
struct Figures {
    ok: usize,
    effects: i64,
    duplicates: i64,
    replays: usize,
    /// Keyed calls made before the others, until one was answered: the
    /// answer that proves the route deduplicates (`retries_http::proof`).
    proving: usize,
    /// Why the calls that failed did (their status, or their error).
    failed: Vec<String>,
}

type Inner = Client<HttpConnector, ReplayBody<Full<Bytes>>>;

/// One run against servers in `mode` (`layer`, `cache`, `none`); with
/// `declared`, the client trusts the servers to deduplicate without their
/// mark (`dedup_declared`), as every client did before the mark: what the
/// cache and no deduplication then cost is the server's alone.
async fn run(cluster: &Cluster, mode: &str, declared: bool) -> Figures {
    let url = cluster.url();
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .expect("a pool");
    for sql in [
        "DROP TABLE IF EXISTS charges, cache, retries_idempotency_keys",
        "CREATE TABLE charges (id bigserial PRIMARY KEY, key text NOT NULL, cents bigint NOT NULL)",
        "CREATE TABLE cache (key text PRIMARY KEY, answer text NOT NULL)",
    ] {
        sqlx::query(sql).execute(&pool).await.expect("the tables");
    }
    retries_sqlx::PgKeyStore::new(pool.clone())
        .migrate()
        .await
        .expect("the key table");

    let mut replicas: Vec<Replica> = (0..3)
        .map(|i| Replica::start(&url, 0, mode, 4700 + i))
        .collect();
    let addrs: Vec<SocketAddr> = replicas
        .iter()
        .map(|r| SocketAddr::from(([127, 0, 0, 1], r.port)))
        .collect();
    let client: Inner = Client::builder(TokioExecutor::new()).build_http();
    let endpoints: Vec<At<Inner>> = addrs
        .iter()
        .map(|a| At::new(a.to_string().parse().unwrap(), client.clone()))
        .collect();
    // Attempts shorter than the slow charges, and enough of them for a
    // busy machine: the deadline bounds the call.
    let policy = Policy::new(Duration::from_mins(1))
        .with_max_attempts(40)
        .with_attempt_timeout(Duration::from_millis(250))
        .with_backoff(Backoff::exponential(
            Duration::from_millis(10),
            2.0,
            Duration::from_millis(400),
        ));
    let layer = RetryLayer::new(policy)
        // Every call gets its retries: what is measured is the server's
        // deduplication, not the budget's protection.
        .budget(NoBudget)
        .idempotent_by_key(http::HeaderName::from_static("idempotency-key"))
        .avoid_tried();
    let layer = if declared {
        layer.dedup_declared()
    } else {
        layer
    };
    let svc = layer.layer(P2c::new(ServiceList::new(endpoints)));

    // Servers with the layer prove it by their first answer; until then a
    // lost reply ends unknown instead of being sent again.
    let mut proving = 0;
    if mode == "layer" && !declared {
        loop {
            proving += 1;
            let request = http::Request::post("/charges")
                .body(Full::new(Bytes::from(format!("{}", 10 * CALLS + proving))))
                .unwrap();
            if svc.clone().oneshot(request).await.is_ok() {
                break;
            }
        }
    }
    let tally = Arc::new(Tally::default());
    let workers: Vec<_> = (0..IN_FLIGHT)
        .map(|_| tokio::spawn(charge_calls(svc.clone(), Arc::clone(&tally))))
        .collect();
    // Mid-run: replica 1 killed, and started again on its port.
    while tally.done.load(Ordering::Relaxed) < KILL_AT {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let port = replicas[1].port;
    replicas[1].kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    replicas[1] = Replica::start(&url, port, mode, 4800);
    for w in workers {
        w.await.unwrap();
    }
    let (effects, duplicates): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(*) - count(DISTINCT key) FROM charges")
            .fetch_one(&pool)
            .await
            .expect("the count");
    Figures {
        ok: tally.ok.load(Ordering::Relaxed),
        effects,
        duplicates,
        replays: tally.replays.load(Ordering::Relaxed),
        proving,
        failed: tally.failed.lock().unwrap().clone(),
    }
}

/// What the client's workers counted.
#[derive(Default)]
struct Tally {
    next: AtomicUsize,
    done: AtomicUsize,
    ok: AtomicUsize,
    replays: AtomicUsize,
    failed: std::sync::Mutex<Vec<String>>,
}

/// One worker: charge calls one after another until `CALLS` are taken.
async fn charge_calls<S, RB>(svc: S, tally: Arc<Tally>)
where
    S: tower::Service<http::Request<Full<Bytes>>, Response = http::Response<RB>> + Clone,
    S::Error: std::fmt::Display,
{
    loop {
        let n = tally.next.fetch_add(1, Ordering::Relaxed);
        if n >= CALLS {
            break;
        }
        let request = http::Request::post("/charges")
            .body(Full::new(Bytes::from(format!("{}", 100 + n))))
            .unwrap();
        match svc.clone().oneshot(request).await {
            Ok(response) => {
                if response.status() == http::StatusCode::CREATED {
                    tally.ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    let status = response.status().to_string();
                    tally.failed.lock().unwrap().push(status);
                }
                if response.headers().contains_key("idempotent-replayed") {
                    tally.replays.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => tally.failed.lock().unwrap().push(e.to_string()),
        }
        tally.done.fetch_add(1, Ordering::Relaxed);
    }
}

/// The figures' table, one row a mode (each test prints its own rows).
fn rows(rows: &[(&str, &Figures)]) {
    println!(
        "\n{CALLS} charge calls, {IN_FLIGHT} in flight, over 3 replicas (one killed after {KILL_AT} calls), every fault, 5 % of charges slower than an attempt:"
    );
    println!("| server | calls ok | charges | duplicate charges | calls answered by a replay |");
    println!("|---|---|---|---|---|");
    for (name, f) in rows {
        println!(
            "| {name} | {}/{CALLS} | {} | {} | {} |",
            f.ok, f.effects, f.duplicates, f.replays
        );
    }
}

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_every_fault_and_a_kill_charge_each_call_once() {
    let cluster = Cluster::start(&[]);
    let layer = run(&cluster, "layer", false).await;
    rows(&[(
        "`IdempotencyLayer` + `PgKeyStore`, record in the charge's transaction",
        &layer,
    )]);
    if !layer.failed.is_empty() {
        println!("layer: calls that failed: {:?}", layer.failed);
    }
    assert_eq!(layer.ok, CALLS, "{layer:?}");
    assert_eq!(layer.duplicates, 0, "{layer:?}");
    assert_eq!(
        layer.effects,
        i64::try_from(CALLS + layer.proving).unwrap(),
        "{layer:?}"
    );
    // A fifth of the replies was lost after the charge: those calls were
    // answered by replays.
    assert!(layer.replays >= CALLS / 10, "{layer:?}");
}

/// The same load against the servers of the crates that exist (a cache
/// written after the charge) and against none, in a test of its own so
/// that the two run side by side.
#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_layer_lost_replies_are_charged_twice_unless_the_client_waits_for_the_mark() {
    let cluster = Cluster::start(&[]);
    let cache = run(&cluster, "cache", true).await;
    let none = run(&cluster, "none", true).await;
    let unmarked = run(&cluster, "none", false).await;
    rows(&[
        (
            "the answer cached after the charge (client trusts it)",
            &cache,
        ),
        ("no deduplication (client trusts it)", &none),
        ("no deduplication (client waits for the mark)", &unmarked),
    ]);
    for (name, f) in [("cache", &cache), ("none", &none)] {
        // `unmarked` fails by design: its lost replies end unknown.
        if !f.failed.is_empty() {
            println!("{name}: calls that failed: {:?}", f.failed);
        }
    }
    // Without deduplication every lost reply is a second charge.
    assert!(
        none.duplicates >= i64::try_from(CALLS / 10).unwrap(),
        "{none:?}"
    );
    // A client in keyed mode against servers that never showed the mark
    // sends no unknown outcome again: no duplicate, and the lost replies
    // are calls that end unknown (typed), not second charges.
    assert_eq!(unmarked.duplicates, 0, "{unmarked:?}");
    assert!(unmarked.ok < CALLS, "{unmarked:?}");
}
