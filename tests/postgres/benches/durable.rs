//! Durable calls' throughput against a hand-written `SKIP LOCKED` loop on
//! the same server, pool and concurrency, in one run (issue 62):
//!
//! ```text
//! cargo bench -p retries-postgres-tests --bench durable
//! ```
//!
//! Each round drains 10,000 no-op calls (`DURABLE_BENCH_CALLS`) with 32 at
//! once over a pool of 8 connections. The hand loop is what services
//! write: claim a batch of 32 with `FOR UPDATE SKIP LOCKED` setting a lock
//! time, run its jobs at once, each marked done with one `UPDATE`, and
//! claim the next batch when the last job of this one is done. The worker does what the
//! durable door promises beyond it: each attempt marked started before it
//! is sent (the write that makes a crash an unknown outcome instead of a
//! second charge), a fenced lease, the engine's loop. Rounds alternate;
//! the median of each is reported.

use std::time::{Duration, Instant};

use retries::{Attempt, Policy};
use retries_postgres_tests::Cluster;
use retries_sqlx::durable::{self, Call, Enqueue, Handler, HandlerError, Worker};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

const ROUNDS: usize = 3;
const IN_FLIGHT: usize = 32;
const POLICY: Policy = Policy::new(Duration::from_secs(5)).validated();

fn calls() -> usize {
    std::env::var("DURABLE_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

async fn hand_loop(pool: &PgPool, n: usize) -> Duration {
    sqlx::query("TRUNCATE jobs").execute(pool).await.unwrap();
    sqlx::query("INSERT INTO jobs (payload) SELECT int4send(g) FROM generate_series(1, $1) g")
        .bind(i32::try_from(n).unwrap())
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("ANALYZE jobs").execute(pool).await.unwrap();
    let t = Instant::now();
    loop {
        // A batch claimed, run at once, each marked done as it ends.
        let jobs: Vec<(i64, Vec<u8>)> = sqlx::query_as(
            "UPDATE jobs SET locked_until = clock_timestamp() + interval '10 seconds'
             WHERE id IN (SELECT id FROM jobs
                          WHERE NOT done AND (locked_until IS NULL OR locked_until < clock_timestamp())
                          ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
             RETURNING id, payload",
        )
        .bind(i64::try_from(IN_FLIGHT).unwrap())
        .fetch_all(pool)
        .await
        .unwrap();
        if jobs.is_empty() {
            return t.elapsed();
        }
        let mut batch = tokio::task::JoinSet::new();
        for (id, payload) in jobs {
            let pool = pool.clone();
            batch.spawn(async move {
                std::hint::black_box(payload);
                sqlx::query("UPDATE jobs SET done = true WHERE id = $1")
                    .bind(id)
                    .execute(&pool)
                    .await
                    .unwrap();
            });
        }
        batch.join_all().await;
    }
}

async fn worker(pool: &PgPool, n: usize) -> Duration {
    sqlx::query("TRUNCATE retries_calls")
        .execute(pool)
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    for i in 0..n {
        durable::enqueue(
            &mut tx,
            Enqueue::new("noop", (i as u32).to_le_bytes().to_vec()),
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    // The statistics autovacuum keeps (a table refilled at once has none
    // until it runs): without them the planner sorts every ready call.
    sqlx::query("ANALYZE retries_calls")
        .execute(pool)
        .await
        .unwrap();
    let t = Instant::now();
    let watch = pool.clone();
    Worker::new(pool.clone())
        .concurrency(IN_FLIGHT)
        .poll(Duration::from_millis(10))
        .handle(
            "noop",
            Handler::idempotent(POLICY, async |call: &Call, _: &Attempt| {
                std::hint::black_box(call.payload());
                Ok::<(), HandlerError>(())
            }),
        )
        .run(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let left: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM retries_calls WHERE state <> 'done'")
                        .fetch_one(&watch)
                        .await
                        .unwrap();
                if left == 0 {
                    return;
                }
            }
        })
        .await
        .unwrap();
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    if retries_postgres_tests::binaries().is_none() {
        println!(
            "PostgreSQL's initdb and pg_ctl (13 or later) not found: set PG_BIN. Nothing measured."
        );
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let cluster = Cluster::start(&[]);
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect(&cluster.url())
            .await
            .unwrap();
        durable::migrate(&pool).await.unwrap();
        sqlx::query(
            "CREATE TABLE jobs (id bigserial PRIMARY KEY, payload bytea NOT NULL,
             done boolean NOT NULL DEFAULT false, locked_until timestamptz)",
        )
        .execute(&pool)
        .await
        .unwrap();
        let n = calls();
        let (mut hand, mut ours) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            hand.push(hand_loop(&pool, n).await);
            ours.push(worker(&pool, n).await);
        }
        let (hand, ours) = (median(hand), median(ours));
        let rate = |d: Duration| n as f64 / d.as_secs_f64();
        println!("{n} no-op calls, {IN_FLIGHT} at once, a pool of 8; median of {ROUNDS} alternating rounds");
        println!("| hand-written SKIP LOCKED loop | durable worker | throughput ratio |");
        println!("|---|---|---|");
        println!(
            "| {:.0} calls/s ({:.2} s) | {:.0} calls/s ({:.2} s) | {:.2}× |",
            rate(hand),
            hand.as_secs_f64(),
            rate(ours),
            ours.as_secs_f64(),
            rate(ours) / rate(hand)
        );
    });
}
