//! The README's transaction snippet where services live: compiled, verbatim,
//! inside `tokio::spawn` (which needs a `Send` future, as an axum handler
//! does), and run against a real PostgreSQL cluster. The behaviour suite
//! (`tests/behaviour/tests/readme.rs`) fails when a README block is found in
//! neither file.

#![cfg_attr(no_postgres, allow(unused))]

use std::time::Duration;

use retries::{Attempt, Policy};
use retries_postgres_tests::Cluster;
use retries_sqlx::{Transaction, Transactions, Tx};

const POLICY: Policy = Policy::new(Duration::from_secs(10)).validated();

async fn transfer(tx: &mut Tx) -> Result<(), retries_sqlx::Error> {
    sqlx::query("UPDATE accounts SET balance = balance - 5 WHERE id = 1")
        .execute(&mut *tx)
        .await?;
    sqlx::query("UPDATE accounts SET balance = balance + 5 WHERE id = 2")
        .execute(&mut *tx)
        .await?;
    Ok(())
}

#[rustfmt::skip]
async fn readme_transfer(pool: sqlx::PgPool) -> Result<(), retries_sqlx::Error> {
    retries::call(&POLICY)
        .transaction(Transaction::on(&pool).serializable(), async |tx: &mut Tx, _: &Attempt| transfer(tx).await)
        .await?;
    Ok(())
}

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_transaction_runs_in_a_spawned_task() {
    let cluster = Cluster::start(&[]);
    let pool = sqlx::PgPool::connect(&cluster.url()).await.unwrap();
    sqlx::query("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO accounts VALUES (1, 100), (2, 0)")
        .execute(&pool)
        .await
        .unwrap();
    let spawned = pool.clone();
    tokio::spawn(async move { readme_transfer(spawned).await })
        .await
        .unwrap()
        .unwrap();
    let balances: Vec<(i32, i64)> = sqlx::query_as("SELECT id, balance FROM accounts ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(balances, [(1, 95), (2, 5)]);
}
