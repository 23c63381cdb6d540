//! The transaction door's cost on the happy path, against a hand-written
//! transaction loop on the same pool and server, in one run:
//!
//! ```text
//! cargo bench -p retries-postgres-tests --bench transactions
//! ```
//!
//! Each transaction is pgbench's "simple update" shape: an `UPDATE` of one
//! account and an `INSERT` into a history table, then `COMMIT`. One
//! connection, one transaction at a time, so the figure is the latency a
//! caller waits; rounds of the two alternate, and the median round is
//! reported. Two server settings: the default (`synchronous_commit = on`,
//! every `COMMIT` waits for its WAL flush) and `synchronous_commit = off`
//! (no flush wait: round trips dominate, the door's worst case).

use std::time::{Duration, Instant};

use retries::{Attempt, Policy};
use retries_postgres_tests::Cluster;
use retries_sqlx::{Transactions, Tx};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor as _, PgPool};

const PER_ROUND: u32 = 1000;
const ROUNDS: usize = 7;

const POLICY: Policy = Policy::new(Duration::from_secs(5))
    .with_max_attempts(5)
    .validated();

/// The transaction's statements, on any executor (a plain connection for
/// the hand loop, the door's `Tx`).
async fn statements<X>(tx: &mut X, i: u32) -> Result<(), sqlx::Error>
where
    for<'c> &'c mut X: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    let id = i32::try_from(i % 100).unwrap_or(0);
    sqlx::query("UPDATE accounts SET balance = balance + 1 WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO history (account, delta) VALUES ($1, 1)")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// What users write by hand: begin, the statements, commit; on 40001 or
/// 40P01 start again.
async fn hand_loop(pool: &PgPool, i: u32) -> Result<(), sqlx::Error> {
    loop {
        let mut tx = pool.begin().await?;
        let r = match statements(&mut *tx, i).await {
            Ok(()) => tx.commit().await,
            Err(e) => Err(e),
        };
        match r {
            Err(sqlx::Error::Database(e))
                if matches!(e.code().as_deref(), Some("40001" | "40P01")) => {}
            other => return other,
        }
    }
}

async fn door(pool: &PgPool, i: u32) -> Result<(), sqlx::Error> {
    retries::call(&POLICY)
        .transaction(pool, async |tx: &mut Tx, _: &Attempt| {
            statements(tx, i).await
        })
        .await
}

/// The door with the builder's `reconcile` (by the call's key): no id is
/// read before `COMMIT`.
async fn door_with_reconcile(pool: &PgPool, i: u32) -> Result<(), sqlx::Error> {
    retries::call(&POLICY)
        .not_idempotent()
        .reconcile(async |_key| Ok::<_, sqlx::Error>(None))
        .transaction(pool, async |tx: &mut Tx, _: &Attempt| {
            statements(tx, i).await
        })
        .await
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

async fn measure(settings: &[&str]) -> (Duration, Duration, Duration) {
    let cluster = Cluster::start(settings);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&cluster.url())
        .await
        .expect("a pool");
    pool.execute(
        "CREATE TABLE accounts (id int PRIMARY KEY, balance int8 NOT NULL);
         INSERT INTO accounts SELECT g, 0 FROM generate_series(0, 99) g;
         CREATE TABLE history (account int NOT NULL, delta int NOT NULL, at timestamptz DEFAULT now())",
    )
    .await
    .expect("the tables");
    // Warm up both paths (prepared statements, caches).
    for i in 0..200 {
        hand_loop(&pool, i).await.expect("hand loop");
        door(&pool, i).await.expect("door");
        door_with_reconcile(&pool, i).await.expect("door");
    }
    let (mut hand, mut ours, mut keyed) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for i in 0..PER_ROUND {
            hand_loop(&pool, i).await.expect("hand loop");
        }
        hand.push(t.elapsed() / PER_ROUND);
        let t = Instant::now();
        for i in 0..PER_ROUND {
            door(&pool, i).await.expect("door");
        }
        ours.push(t.elapsed() / PER_ROUND);
        let t = Instant::now();
        for i in 0..PER_ROUND {
            door_with_reconcile(&pool, i).await.expect("door");
        }
        keyed.push(t.elapsed() / PER_ROUND);
    }
    (median(hand), median(ours), median(keyed))
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
    println!(
        "{ROUNDS} rounds of {PER_ROUND} transactions each (UPDATE + INSERT + COMMIT), one connection; median round"
    );
    println!(
        "| server setting | hand-written loop | `transaction` (id read) | ratio | with `reconcile` (no id read) | ratio |"
    );
    println!("|---|---|---|---|---|---|");
    for (name, settings) in [
        ("synchronous_commit = on (default)", &[][..]),
        ("synchronous_commit = off", &["synchronous_commit=off"][..]),
    ] {
        let (hand, ours, keyed) = rt.block_on(measure(settings));
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "| {name} | {:.1} µs | {:.1} µs | {:.3}× | {:.1} µs | {:.3}× |",
            us(hand),
            us(ours),
            us(ours) / us(hand),
            us(keyed),
            us(keyed) / us(hand)
        );
    }
}
