//! Durable calls on PostgreSQL (issue 62): enqueued in the caller's
//! transaction, driven by the engine in worker processes, a crash resolved
//! before anything is sent again.
//!
//! The proof: three `durable_worker` processes share the calls; the
//! charge server (in this process, raw HTTP/1.1 on loopback) drops 20 % of
//! its replies after the charge; workers are killed with `SIGKILL` at
//! random moments and started again, and PostgreSQL is crashed and
//! restarted (`pg_ctl restart -m immediate`). Every call ends done or dead
//! with a reason, none is lost, none is charged twice: against a server
//! that deduplicates by key (an idempotent handler) and against one that
//! does not (a handler with `reconcile`). CI runs 2,000 calls, 4 kills and
//! one restart per mode; `DURABLE_CALLS=10000 DURABLE_KILLS=10
//! DURABLE_RESTARTS=2` runs the issue's full counts.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use retries::{Attempt, Policy, Verdict};
use retries_postgres_tests::Cluster;
use retries_sqlx::durable::{self, Call, Enqueue, Handler, HandlerError, Worker};
use sqlx::postgres::PgPoolOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The charge server's books: effects per key.
#[derive(Default)]
struct Books {
    effects: HashMap<String, u32>,
    /// `reconcile`'s look-ups.
    looked: usize,
    rng: u64,
}

impl Books {
    fn roll(&mut self) -> u64 {
        // xorshift64: the drops are reproducible from the seed printed.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % 100
    }
}

/// A charge server on loopback: `POST /charge/KEY` charges (once per key
/// with `dedup`, else every time) and drops one reply in five after the
/// charge; `GET /charges/KEY` answers how many times the key was charged.
async fn charge_server(dedup: bool, seed: u64) -> (SocketAddr, Arc<Mutex<Books>>) {
    let books = Arc::new(Mutex::new(Books {
        rng: seed | 1,
        ..Books::default()
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let b = Arc::clone(&books);
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            let books = Arc::clone(&b);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 512];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let mut line = head.split_whitespace();
                let (method, path) = (line.next().unwrap_or(""), line.next().unwrap_or(""));
                let (reply, body) = {
                    let mut books = books.lock().unwrap();
                    if let (Some(key), "POST") = (path.strip_prefix("/charge/"), method) {
                        let charged = books.effects.get(key).copied().unwrap_or(0);
                        if !(dedup && charged > 0) {
                            *books.effects.entry(key.to_owned()).or_default() += 1;
                        }
                        (books.roll() >= 20, "charged".to_owned())
                    } else if let Some(key) = path.strip_prefix("/charges/") {
                        books.looked += 1;
                        (
                            true,
                            books.effects.get(key).copied().unwrap_or(0).to_string(),
                        )
                    } else {
                        (true, "no such route".to_owned())
                    }
                };
                // The work after the effect (rendering, a call out): the
                // window in which a killed worker leaves a charge unanswered.
                tokio::time::sleep(Duration::from_millis(50)).await;
                if reply {
                    let _ = s
                        .write_all(format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len()).as_bytes())
                        .await;
                }
                // Else dropped: the connection closes with no answer.
            });
        }
    });
    (addr, books)
}

/// A worker process, killed when dropped.
struct WorkerProcess(Child);

impl WorkerProcess {
    fn start(url: &str, charge: SocketAddr, mode: &str) -> Self {
        Self(
            Command::new(env!("CARGO_BIN_EXE_durable_worker"))
                .args([url, &charge.to_string(), mode, "1000"])
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("the worker"),
        )
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn pool(url: &str) -> sqlx::PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
        .expect("a pool")
}

/// One mode's proof; returns (done, dead, charged twice, seconds).
#[allow(clippy::too_many_lines)] // the run, its chaos and its books, in order
async fn proof(mode: &str, dedup: bool) -> (usize, usize, usize, f64) {
    let calls = env("DURABLE_CALLS", 2000);
    let kills = env("DURABLE_KILLS", 4);
    let restarts = env("DURABLE_RESTARTS", 1);
    let cluster = Cluster::start(&[]);
    let url = cluster.url();
    let db = pool(&url).await;
    durable::migrate(&db).await.expect("the table");
    let mut keys = Vec::new();
    for batch in 0..calls.div_ceil(500) {
        let mut tx = db.begin().await.unwrap();
        for i in batch * 500..calls.min((batch + 1) * 500) {
            let e = durable::enqueue(
                &mut tx,
                Enqueue::new("charge", i.to_le_bytes().to_vec()).ttl(Duration::from_mins(2)),
            )
            .await
            .unwrap();
            keys.push(e.key.to_string());
        }
        tx.commit().await.unwrap();
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        .into();
    let (charge, books) = charge_server(dedup, seed).await;
    let t0 = std::time::Instant::now();
    let mut workers: Vec<_> = (0..3)
        .map(|_| WorkerProcess::start(&url, charge, mode))
        .collect();
    let mut rng = seed | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // The kills, at random moments, and the restarts of the server among
    // them.
    let chaos = kills.max(restarts);
    for k in 0..chaos {
        tokio::time::sleep(Duration::from_millis(150 + next() % 400)).await;
        if k < kills {
            let w = usize::try_from(next() % 3).unwrap();
            workers[w].kill();
            workers[w] = WorkerProcess::start(&url, charge, mode);
        }
        // The restarts in the middle of the kills.
        if (k + 1) * restarts / chaos != k * restarts / chaos {
            let c = &cluster;
            tokio::task::block_in_place(|| c.crash_restart());
        }
    }
    // Until no call is left to run.
    let db = pool(&url).await;
    let deadline = std::time::Instant::now() + Duration::from_mins(3);
    let (done, dead) = loop {
        if let Ok(s) = durable::stats(&db).await
            && let Some(s) = s.first()
            && s.ready == 0
        {
            break (s.done, s.dead);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "calls still ready after 180 s: {:?}",
            durable::stats(&db).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let took = t0.elapsed().as_secs_f64();
    drop(workers);
    let reclaimed: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM retries_calls WHERE lease > 1")
        .fetch_one(&db)
        .await
        .unwrap();
    let rows: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT key, state, reason FROM retries_calls")
            .fetch_all(&db)
            .await
            .unwrap();
    let books = books.lock().unwrap();
    let twice = books.effects.values().filter(|&&n| n > 1).count();
    let mut reasons: HashMap<String, usize> = HashMap::new();
    for (key, state, reason) in &rows {
        match state.as_str() {
            // Done: charged, once.
            "done" => assert_eq!(books.effects.get(key), Some(&1), "done key {key}"),
            "dead" => {
                *reasons
                    .entry(reason.clone().expect("a dead call's reason"))
                    .or_default() += 1;
            }
            other => panic!("key {key} left {other}"),
        }
    }
    eprintln!(
        "durable {mode}: {calls} calls, {kills} worker kills, {restarts} server restarts (seed {seed}): \
         {done} done, {dead} dead {reasons:?}, {twice} charged twice, {took:.1} s; \
         {reclaimed} claimed more than once, {} look-ups by reconcile",
        books.looked
    );
    assert_eq!(rows.len(), calls, "every call is in the table");
    assert_eq!(usize::try_from(done + dead).unwrap(), calls, "none lost");
    (
        usize::try_from(done).unwrap(),
        usize::try_from(dead).unwrap(),
        twice,
        took,
    )
}

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_killed_and_a_crashed_server_charge_no_call_twice_with_a_deduplicating_server() {
    let (done, _, twice, _) = proof("dedup", true).await;
    assert_eq!(twice, 0);
    assert!(done > 0);
}

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_killed_and_a_crashed_server_charge_no_call_twice_with_reconcile() {
    let (done, _, twice, _) = proof("reconcile", false).await;
    assert_eq!(twice, 0);
    assert!(done > 0);
}

const QUICK: Policy = Policy::new(Duration::from_secs(2))
    .with_max_attempts(4)
    .with_initial_backoff(Duration::from_millis(10))
    .validated();

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_exists_exactly_when_its_transaction_commits_and_once_per_key() {
    let cluster = Cluster::start(&[]);
    let db = pool(&cluster.url()).await;
    durable::migrate(&db).await.unwrap();
    durable::migrate(&db).await.unwrap();
    let key = retries::IdempotencyKey::random();
    let mut tx = db.begin().await.unwrap();
    let e = durable::enqueue(&mut tx, Enqueue::new("x", b"1".to_vec()).key(key))
        .await
        .unwrap();
    assert!(e.added);
    tx.rollback().await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM retries_calls")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(n, 0, "rolled back: no call");
    let mut tx = db.begin().await.unwrap();
    assert!(
        durable::enqueue(&mut tx, Enqueue::new("x", b"1".to_vec()).key(key))
            .await
            .unwrap()
            .added
    );
    tx.commit().await.unwrap();
    let mut c = db.acquire().await.unwrap();
    let again = durable::enqueue(&mut c, Enqueue::new("x", b"2".to_vec()).key(key))
        .await
        .unwrap();
    assert_eq!((again.key, again.added), (key, false), "one call per key");
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM retries_calls")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(n, 1);
}

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines, clippy::type_complexity)] // one worker's every ending, in order
async fn a_worker_ends_every_call_done_or_dead_with_its_reason() {
    let cluster = Cluster::start(&[]);
    let db = pool(&cluster.url()).await;
    durable::migrate(&db).await.unwrap();
    let mut tx = db.begin().await.unwrap();
    for (name, payload) in [
        ("flaky", br#"{"n": 1}"#.to_vec()),
        ("flaky", b"not json".to_vec()),
        ("panics", b"{}".to_vec()),
        ("refused", b"{}".to_vec()),
        ("unknown-name", b"{}".to_vec()),
    ] {
        let ttl = if name == "unknown-name" {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(30)
        };
        durable::enqueue(&mut tx, Enqueue::new(name, payload).ttl(ttl))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let tries = Arc::new(Mutex::new(Vec::new()));
    let t = Arc::clone(&tries);
    let worker = Worker::new(db.clone())
        .poll(Duration::from_millis(20))
        .handle(
            "flaky",
            Handler::idempotent(QUICK, async move |call: &Call, at: &Attempt| {
                let _: serde_json::Value = call.json()?;
                t.lock()
                    .unwrap()
                    .push((at.number(), at.idempotency_key() == call.key()));
                if at.number() < 3 {
                    Err(HandlerError::new(Verdict::not_executed(), "refused"))
                } else {
                    Ok(())
                }
            }),
        )
        .handle(
            "panics",
            Handler::not_idempotent(
                QUICK,
                async |_: &Call, _: &Attempt| -> Result<(), HandlerError> {
                    panic!("the handler's bug")
                },
            ),
        )
        .handle(
            "refused",
            Handler::idempotent(QUICK, async |_: &Call, _: &Attempt| {
                Err::<(), _>(HandlerError::new(
                    Verdict::permanent(),
                    "400: no such account",
                ))
            }),
        );
    let db2 = db.clone();
    worker
        .run(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let s = durable::stats(&db2).await.unwrap();
                if s.iter().all(|s| s.ready == 0) {
                    return;
                }
            }
        })
        .await
        .unwrap();
    let rows: Vec<(String, String, Option<String>, i32, Option<String>)> = sqlx::query_as(
        "SELECT name, state, reason, attempts, last_error FROM retries_calls ORDER BY id",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    let summary: Vec<(&str, &str, Option<&str>, i32)> = rows
        .iter()
        .map(|r| (r.0.as_str(), r.1.as_str(), r.2.as_deref(), r.3))
        .collect();
    assert_eq!(
        summary,
        [
            ("flaky", "done", None, 3),
            ("flaky", "dead", Some("permanent"), 1),
            ("panics", "dead", Some("unknown_outcome"), 1),
            ("refused", "dead", Some("permanent"), 1),
            ("unknown-name", "dead", Some("deadline_exceeded"), 0),
        ]
    );
    assert!(
        rows[1]
            .4
            .as_deref()
            .unwrap()
            .contains("not the handler's JSON"),
        "{:?}",
        rows[1].4
    );
    assert!(
        rows[2].4.as_deref().unwrap().contains("the handler's bug"),
        "{:?}",
        rows[2].4
    );
    assert_eq!(*tries.lock().unwrap(), [(1, true), (2, true), (3, true)]);
    let dead: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM retries_dead_calls")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(dead, 4);
    // Redriven at the operator's rate: each again with its key, marked
    // started (the panicking handler, not idempotent and without
    // `reconcile`, is dead again at once as an unknown outcome: nothing
    // sent).
    let revived = durable::redrive(&db, &["panics"], 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(revived, 1);
    let row: (String, bool) =
        sqlx::query_as("SELECT state, started FROM retries_calls WHERE name = 'panics'")
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(row, ("ready".to_owned(), true));
}
