//! `Retry::transaction` against a real PostgreSQL: the rerun of a rolled-back
//! transaction (write skew, deadlock, a swallowed failure), the lost `COMMIT`
//! reply found or rerun, and the attempt's time on the server.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use retries::{Attempt, Backoff, IdempotencyKey, NoBudget, Policy, Reason};
use retries_postgres_tests::{Cluster, Fault, Proxy};
use retries_sqlx::{Transaction, Transactions, Tx};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor as _, PgPool};
use tokio::sync::Barrier;

fn policy(deadline: Duration, attempts: u32) -> Policy {
    Policy::new(deadline)
        .with_max_attempts(attempts)
        .with_backoff(Backoff::constant(Duration::from_millis(10)))
}

async fn pool(url: &str, max: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .expect("a pool")
}

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .expect("a count")
}

/// Two serializable transactions in write skew (each reads both doctors on
/// call, then takes itself off): PostgreSQL fails one with 40001, the door
/// reruns it whole, and the rerun reads the other's commit. The end state is
/// what a serial run gives: one doctor still on call.
#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_skew_is_rerun_until_serial() {
    let cluster = Cluster::start(&[]);
    let pool = pool(&cluster.url(), 4).await;
    pool.execute("CREATE TABLE doctors (name text PRIMARY KEY, on_call bool NOT NULL); INSERT INTO doctors VALUES ('alice', true), ('bob', true)")
        .await
        .unwrap();
    let both_read = Arc::new(Barrier::new(2));
    let runs = Arc::new(AtomicU32::new(0));
    let policy = policy(Duration::from_secs(10), 3);
    // In `tokio::spawn`: the boxed form, whose future is `Send`.
    let leave = |name: &'static str| {
        let (pool, both_read, runs) = (pool.clone(), both_read.clone(), runs.clone());
        async move {
            retries::call(&policy)
                .budget(NoBudget)
                .transaction_fn(
                    Transaction::on(&pool).serializable(),
                    |tx: &mut Tx, at: &Attempt| {
                        let (both_read, runs, first) =
                            (both_read.clone(), runs.clone(), at.number() == 1);
                        Box::pin(async move {
                            runs.fetch_add(1, Ordering::Relaxed);
                            let on_call: i64 =
                                sqlx::query_scalar("SELECT count(*) FROM doctors WHERE on_call")
                                    .fetch_one(&mut *tx)
                                    .await?;
                            if first {
                                both_read.wait().await; // both have read before either writes
                            }
                            if on_call >= 2 {
                                sqlx::query("UPDATE doctors SET on_call = false WHERE name = $1")
                                    .bind(name)
                                    .execute(&mut *tx)
                                    .await?;
                            }
                            Ok::<_, sqlx::Error>(on_call)
                        })
                    },
                )
                .await
        }
    };
    let (a, b) = tokio::join!(tokio::spawn(leave("alice")), tokio::spawn(leave("bob")));
    let (a, b) = (
        a.unwrap().expect("alice's call"),
        b.unwrap().expect("bob's call"),
    );
    // One saw two on call and left; the other, rerun, saw one and stayed.
    let mut seen = [a, b];
    seen.sort_unstable();
    assert_eq!(seen, [1, 2]);
    assert_eq!(
        runs.load(Ordering::Relaxed),
        3,
        "one rerun, of the transaction that lost"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM doctors WHERE on_call").await,
        1
    );
}

/// Two transactions lock two rows in opposite orders: PostgreSQL breaks the
/// deadlock with 40P01, the door reruns the victim, and both increments land.
#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlock_victim_is_rerun() {
    let cluster = Cluster::start(&["deadlock_timeout=50ms"]);
    let pool = pool(&cluster.url(), 4).await;
    pool.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); INSERT INTO t VALUES (1, 0), (2, 0)",
    )
    .await
    .unwrap();
    let both_locked = Arc::new(Barrier::new(2));
    let runs = Arc::new(AtomicU32::new(0));
    let policy = policy(Duration::from_secs(10), 3);
    let bump = |first: i32, second: i32| {
        let (pool, both_locked, runs) = (pool.clone(), both_locked.clone(), runs.clone());
        async move {
            retries::call(&policy)
                .budget(NoBudget)
                .transaction(&pool, async |tx: &mut Tx, at: &Attempt| {
                    runs.fetch_add(1, Ordering::Relaxed);
                    sqlx::query("UPDATE t SET v = v + 1 WHERE id = $1")
                        .bind(first)
                        .execute(&mut *tx)
                        .await?;
                    if at.number() == 1 {
                        both_locked.wait().await;
                    }
                    sqlx::query("UPDATE t SET v = v + 1 WHERE id = $1")
                        .bind(second)
                        .execute(&mut *tx)
                        .await?;
                    Ok::<_, sqlx::Error>(())
                })
                .await
        }
    };
    // Both in this task: the `async` closure form.
    let (a, b) = tokio::join!(bump(1, 2), bump(2, 1));
    a.expect("the first call");
    b.expect("the second call");
    assert_eq!(runs.load(Ordering::Relaxed), 3, "the victim ran twice");
    assert_eq!(
        count(&pool, "SELECT sum(v)::int8 FROM t WHERE v = 2").await,
        4
    );
}

/// The trap, shown on the server first: a statement fails with 40001, the
/// code swallows it, and `COMMIT` of the aborted transaction "succeeds" with
/// nothing written. Through the door, the attempt fails with that 40001
/// (no `COMMIT` is sent), the closure reruns, and its row is committed.
#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swallowed_failure_is_never_a_success() {
    let cluster = Cluster::start(&[]);
    let pool = pool(&cluster.url(), 2).await;
    pool.execute("CREATE TABLE rows (attempt int NOT NULL)")
        .await
        .unwrap();
    let fail =
        "DO $$ BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001'; END $$";

    // Plain sqlx: the commit reports Ok, the row is gone.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO rows VALUES (0)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let _ = sqlx::query(fail).execute(&mut *tx).await; // swallowed
    tx.commit()
        .await
        .expect("PostgreSQL answers ROLLBACK, not an error");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM rows").await,
        0,
        "the trap: Ok, nothing written"
    );

    let policy = policy(Duration::from_secs(5), 3);
    let mut errors = Vec::new();
    let done = retries::call(&policy)
        .budget(NoBudget)
        .on_retry(|e: &retries::RetryEvent<'_, sqlx::Error>| {
            errors.push(e.error().map(ToString::to_string));
        })
        .transaction(&pool, async |tx: &mut Tx, at: &Attempt| {
            sqlx::query("INSERT INTO rows VALUES ($1)")
                .bind(at.number().cast_signed())
                .execute(&mut *tx)
                .await?;
            if at.number() == 1 {
                let _ = sqlx::query(fail).execute(&mut *tx).await; // swallowed again
            }
            Ok::<_, sqlx::Error>(at.number())
        })
        .await;
    assert_eq!(done.unwrap(), 2, "the first attempt is not a success");
    assert_eq!(errors.len(), 1);
    let first = errors[0].as_deref().unwrap_or_default();
    assert!(
        first.contains("did not return") && first.contains("could not serialize"),
        "{first}"
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM rows").await, 1);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM rows WHERE attempt = 2").await,
        1
    );
}

/// A batch of rows under one external id, inserted in one transaction.
async fn insert_batch(tx: &mut Tx, external_id: &str) -> Result<u32, sqlx::Error> {
    for item in 0..3 {
        sqlx::query("INSERT INTO batch (external_id, item) VALUES ($1, $2)")
            .bind(external_id)
            .bind(item)
            .execute(&mut *tx)
            .await?;
    }
    Ok(3)
}

async fn batch_table(pool: &PgPool) {
    pool.execute("CREATE TABLE batch (external_id text NOT NULL, item int NOT NULL)")
        .await
        .unwrap();
}

/// `COMMIT` reached the server and committed; the proxy closed the client's
/// socket before relaying the answer. The door looks the transaction up,
/// finds it committed, and returns the closure's value: one batch, one run.
#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_commit_reply_is_found_committed() {
    let (runs, rows) = lose_commit(Fault::DropReply).await;
    assert_eq!(runs, 1, "not rerun");
    assert_eq!(rows, 3, "one batch");
}

/// `COMMIT` never reached the server: the connection closed with the
/// transaction open, so it aborted. The look-up finds it aborted, and the
/// closure reruns: one batch, two runs.
#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_commit_request_is_found_aborted_and_rerun() {
    let (runs, rows) = lose_commit(Fault::DropRequest).await;
    assert_eq!(runs, 2, "rerun once");
    assert_eq!(rows, 3, "one batch");
}

/// One batch insert through the door, with `fault` on its first `COMMIT`:
/// how many times the closure ran, and the rows left.
async fn lose_commit(fault: Fault) -> (u32, i64) {
    let cluster = Cluster::start(&[]);
    let proxy = Proxy::start(cluster.addr()).await;
    let pool = pool(&Cluster::url_via(proxy.addr()), 4).await;
    batch_table(&pool).await;
    proxy.arm("COMMIT", fault);
    let runs = AtomicU32::new(0);
    let policy = policy(Duration::from_secs(5), 3);
    let n = retries::call(&policy)
        .budget(NoBudget)
        .transaction(&pool, async |tx: &mut Tx, _: &Attempt| {
            runs.fetch_add(1, Ordering::Relaxed);
            insert_batch(tx, "b-1").await
        })
        .await;
    assert_eq!(proxy.fired(), 1);
    assert_eq!(n.expect("resolved: committed, or rerun and committed"), 3);
    (
        runs.load(Ordering::Relaxed),
        count(&pool, "SELECT count(*) FROM batch").await,
    )
}

/// A user `reconcile` replaces the look-up: it finds the batch by the call's
/// idempotency key after a lost reply, and says "not there" after a lost
/// request. It is not asked about a failure before `COMMIT`.
#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_reconcile_replaces_the_lookup() {
    let cluster = Cluster::start(&[]);
    let proxy = Proxy::start(cluster.addr()).await;
    let pool = pool(&Cluster::url_via(proxy.addr()), 4).await;
    batch_table(&pool).await;
    let policy = policy(Duration::from_secs(5), 3);
    for (fault, runs_expected) in [(Fault::DropReply, 1), (Fault::DropRequest, 2)] {
        pool.execute("TRUNCATE batch").await.unwrap();
        // The first attempt also loses its connection before COMMIT.
        proxy.arm("INSERT", Fault::DropRequest);
        proxy.arm("COMMIT", fault);
        let runs = AtomicU32::new(0);
        let asked = Mutex::new(Vec::<IdempotencyKey>::new());
        let n = retries::call(&policy)
            .budget(NoBudget)
            .not_idempotent()
            .reconcile(async |key: IdempotencyKey| {
                asked.lock().unwrap().push(key);
                let found: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM batch WHERE external_id = $1")
                        .bind(key.to_string())
                        .fetch_one(&pool)
                        .await?;
                Ok::<_, sqlx::Error>((found > 0).then_some(found as u32))
            })
            .transaction(&pool, async |tx: &mut Tx, at: &Attempt| {
                runs.fetch_add(1, Ordering::Relaxed);
                insert_batch(tx, &at.idempotency_key().to_string()).await
            })
            .await;
        assert_eq!(proxy.fired(), if fault == Fault::DropReply { 2 } else { 4 });
        assert_eq!(n.expect("resolved"), 3, "{fault:?}");
        assert_eq!(
            runs.load(Ordering::Relaxed),
            runs_expected + 1,
            "{fault:?}: the lost INSERT reran too"
        );
        assert_eq!(
            asked.lock().unwrap().len(),
            1,
            "{fault:?}: asked only after the COMMIT"
        );
        assert_eq!(
            count(&pool, "SELECT count(*) FROM batch").await,
            3,
            "{fault:?}: one batch"
        );
    }
}

/// A cluster behind the fault proxy with the batch table, and a policy whose
/// attempts (150 ms, within a 1 s deadline) are shorter than a held `COMMIT`.
async fn held_commits() -> (Cluster, Proxy, PgPool, Policy) {
    let cluster = Cluster::start(&[]);
    let proxy = Proxy::start(cluster.addr()).await;
    let pool = pool(&Cluster::url_via(proxy.addr()), 4).await;
    batch_table(&pool).await;
    let policy = policy(Duration::from_secs(1), 3).with_attempt_timeout(Duration::from_millis(150));
    (cluster, proxy, pool, policy)
}

/// The proxy holds `COMMIT` longer than the attempt may run: the attempt is
/// cut off with `COMMIT` sent, and the look-up sees the transaction still in
/// progress. Held shorter than the call's deadline, the look-up sees it
/// commit and the call succeeds without a rerun; held past it, the call
/// stops with an unknown outcome (naming the transaction) at its deadline,
/// never as a success.
#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_in_progress_is_watched_until_the_deadline() {
    let (_cluster, proxy, pool, policy) = held_commits().await;

    proxy.arm("COMMIT", Fault::Delay(Duration::from_millis(400)));
    let runs = AtomicU32::new(0);
    let n = retries::call(&policy)
        .budget(NoBudget)
        .transaction(&pool, async |tx: &mut Tx, _: &Attempt| {
            runs.fetch_add(1, Ordering::Relaxed);
            insert_batch(tx, "held-briefly").await
        })
        .await;
    assert_eq!(n.expect("seen to commit"), 3);
    assert_eq!(runs.load(Ordering::Relaxed), 1);

    proxy.arm("COMMIT", Fault::Delay(Duration::from_millis(1500)));
    let started = tokio::time::Instant::now();
    let stopped = retries::call(&policy)
        .budget(NoBudget)
        .transaction_outcome(&pool, async |tx: &mut Tx, _: &Attempt| {
            insert_batch(tx, "held-long").await
        })
        .await
        .expect_err("the outcome is unknown");
    let took = started.elapsed();
    assert_eq!(stopped.reason(), Reason::UnknownOutcome);
    assert!(
        took <= Duration::from_millis(1050),
        "stopped at the deadline, not after: {took:?}"
    );
    assert!(
        stopped.last_attempt_cut_off(),
        "the attempt was cut off with COMMIT in flight"
    );
    let looked_up = stopped.reconcile_error().expect("the look-up's answer");
    let message = looked_up.to_string();
    assert!(
        message.contains("outcome is unknown") && message.contains("in progress"),
        "{message}"
    );
    let code = looked_up
        .as_database_error()
        .and_then(|e| e.code().map(std::borrow::Cow::into_owned));
    assert_eq!(code.as_deref(), Some("40003"));
    // The held COMMIT reaches the server after the call's deadline, when the
    // server has ended the transaction (idle past the call's time left): the
    // call reported no success for it, nothing ran twice, and nothing is
    // left in progress on the server.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM batch WHERE external_id = 'held-long'"
        )
        .await,
        0
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM batch").await, 3);
}

/// The call's deadline (no attempt timeout) comes while `COMMIT` is held:
/// the wait for its reply ends just before the deadline, and the call stops
/// with the outcome unknown — never `DeadlineExceeded`, which would tell the
/// caller that nothing happened in time; here the server ends the held
/// transaction at the deadline (the door's idle bound), so the `COMMIT`
/// arriving later commits nothing. A `transaction()` caller gets SQLSTATE `40003` naming
/// the transaction, not the `COMMIT`'s I/O error.
#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_during_commit_leaves_the_outcome_unknown() {
    let cluster = Cluster::start(&[]);
    let proxy = Proxy::start(cluster.addr()).await;
    let pool = pool(&Cluster::url_via(proxy.addr()), 4).await;
    batch_table(&pool).await;
    let policy = policy(Duration::from_secs(1), 3);

    proxy.arm("COMMIT", Fault::Delay(Duration::from_millis(1300)));
    let started = tokio::time::Instant::now();
    let stopped = retries::call(&policy)
        .budget(NoBudget)
        .transaction_outcome(&pool, async |tx: &mut Tx, _: &Attempt| {
            insert_batch(tx, "cut-by-deadline").await
        })
        .await
        .expect_err("the outcome is unknown");
    let took = started.elapsed();
    assert_eq!(stopped.reason(), Reason::UnknownOutcome);
    assert_eq!(stopped.attempts(), 1);
    assert!(
        took < Duration::from_millis(1100),
        "by the deadline: {took:?}"
    );

    proxy.arm("COMMIT", Fault::Delay(Duration::from_millis(1300)));
    let err = retries::call(&policy)
        .budget(NoBudget)
        .transaction(&pool, async |tx: &mut Tx, _: &Attempt| {
            insert_batch(tx, "cut-by-deadline-2").await
        })
        .await
        .expect_err("the outcome is unknown");
    let message = err.to_string();
    let code = err
        .as_database_error()
        .and_then(|e| e.code().map(std::borrow::Cow::into_owned));
    assert_eq!(code.as_deref(), Some("40003"), "{message}");
    assert!(
        message.contains("COMMIT of transaction") && message.contains("outcome is unknown"),
        "{message}"
    );
    // Both held COMMITs reach the server after the deadline, when it has
    // ended their transactions (idle past the call's time left): the callers
    // were told "unknown", never a success, and never "deadline exceeded"
    // (which would have invited a second run); nothing is left in progress.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(count(&pool, "SELECT count(*) FROM batch").await, 0);
}

/// The deadline cuts a later look-up short: the call still reports the last
/// answer the server gave ("in progress"), not only that the last look-up
/// went unanswered.
#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_up_cut_short_keeps_the_last_answer() {
    let (_cluster, proxy, pool, policy) = held_commits().await;

    proxy.arm("COMMIT", Fault::Delay(Duration::from_millis(1500)));
    // The first look-up is answered; the second is held past the deadline.
    proxy.arm(
        "SELECT pg_xact_status",
        Fault::Delay(Duration::from_millis(1)),
    );
    proxy.arm(
        "SELECT pg_xact_status",
        Fault::Delay(Duration::from_secs(3)),
    );
    let stopped = retries::call(&policy)
        .budget(NoBudget)
        .transaction_outcome(&pool, async |tx: &mut Tx, _: &Attempt| {
            insert_batch(tx, "held-long").await
        })
        .await
        .expect_err("the outcome is unknown");
    assert_eq!(stopped.reason(), Reason::UnknownOutcome);
    assert_eq!(proxy.fired(), 3, "COMMIT and two look-ups were held");
    let message = stopped
        .reconcile_error()
        .expect("the look-up's answer")
        .to_string();
    assert!(
        message.contains("'in progress' when last asked")
            && message.contains("no answer before the deadline"),
        "{message}"
    );
}

/// Each attempt's statements are bounded on the server by the attempt's own
/// time (`SET LOCAL statement_timeout`), and a statement that runs past it
/// is cancelled by the server.
#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_are_bounded_by_the_attempt() {
    let cluster = Cluster::start(&[]);
    let pool = pool(&cluster.url(), 2).await;
    let policy = policy(Duration::from_secs(3), 2).with_attempt_timeout(Duration::from_millis(500));
    let settings = Mutex::new(Vec::new());
    let r = retries::call(&policy)
        .budget(NoBudget)
        .transaction_outcome(&pool, async |tx: &mut Tx, _: &Attempt| {
            let ms: String = sqlx::query_scalar("SELECT current_setting('statement_timeout')")
                .fetch_one(&mut *tx)
                .await?;
            settings.lock().unwrap().push(ms);
            sqlx::query("SELECT pg_sleep(10)").execute(&mut *tx).await?;
            Ok::<_, sqlx::Error>(())
        })
        .await;
    let settings = settings.into_inner().unwrap();
    assert_eq!(settings.len(), 2, "both attempts ran: {settings:?}");
    for s in &settings {
        let ms: u64 = s.trim_end_matches("ms").parse().unwrap_or(u64::MAX);
        assert!((1..=500).contains(&ms), "statement_timeout {s}");
    }
    let failure = r.expect_err("pg_sleep(10) never finishes in 500 ms");
    assert_eq!(failure.reason(), Reason::Exhausted);
}

/// Errors that do not abort the transaction are the closure's own: a row
/// not found is permanent (no rerun); a unique violation is permanent by
/// default and rerun with `retry_unique_violation`.
#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_errors_are_not_rerun() {
    let cluster = Cluster::start(&[]);
    let pool = pool(&cluster.url(), 2).await;
    pool.execute("CREATE TABLE k (id int PRIMARY KEY); INSERT INTO k VALUES (1)")
        .await
        .unwrap();
    let policy = policy(Duration::from_secs(3), 3);

    let runs = AtomicU32::new(0);
    let r = retries::call(&policy)
        .budget(NoBudget)
        .transaction_outcome(&pool, async |tx: &mut Tx, _: &Attempt| {
            runs.fetch_add(1, Ordering::Relaxed);
            let id: i32 = sqlx::query_scalar("SELECT id FROM k WHERE id = 2")
                .fetch_one(&mut *tx)
                .await?;
            Ok::<_, sqlx::Error>(id)
        })
        .await;
    assert_eq!(r.expect_err("no row").reason(), Reason::Permanent);
    assert_eq!(runs.load(Ordering::Relaxed), 1);

    for (retry_unique, runs_expected, reason) in
        [(false, 1, Reason::Permanent), (true, 3, Reason::Exhausted)]
    {
        let runs = AtomicU32::new(0);
        let r = retries::call(&policy)
            .budget(NoBudget)
            .transaction_outcome(
                Transaction::on(&pool).retry_unique_violation(retry_unique),
                async |tx: &mut Tx, _: &Attempt| {
                    runs.fetch_add(1, Ordering::Relaxed);
                    sqlx::query("INSERT INTO k VALUES (1)")
                        .execute(&mut *tx)
                        .await?;
                    Ok::<_, sqlx::Error>(())
                },
            )
            .await;
        assert_eq!(r.expect_err("duplicate key").reason(), reason);
        assert_eq!(
            runs.load(Ordering::Relaxed),
            runs_expected,
            "retry_unique_violation({retry_unique})"
        );
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM k").await, 1);
}

/// Inside a scope whose deadline has passed (a server handler whose caller's
/// time is up), the transaction door takes no connection and runs nothing:
/// `DeadlineExceeded` with 0 attempts.
#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_transaction_after_the_deadline() {
    let cluster = Cluster::start(&[]);
    let pool = pool(&cluster.url(), 2).await;
    let runs = AtomicU32::new(0);
    let policy = policy(Duration::from_secs(1), 3);
    let passed = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let stopped = retries::scope::with_deadline(
        passed,
        retries::call(&policy).transaction_outcome(&pool, async |_: &mut Tx, _: &Attempt| {
            runs.fetch_add(1, Ordering::Relaxed);
            Ok::<_, sqlx::Error>(())
        }),
    )
    .await
    .expect_err("no attempt");
    assert_eq!(stopped.reason(), Reason::DeadlineExceeded);
    assert_eq!(stopped.attempts(), 0);
    assert_eq!(runs.load(Ordering::Relaxed), 0);
    // With the door's error type the stop reads as one, not as an error
    // "returned from database".
    let err = retries::scope::with_deadline(
        passed,
        retries::call(&policy).transaction(&pool, async |_: &mut Tx, _: &Attempt| {
            Ok::<_, retries_sqlx::Error>(())
        }),
    )
    .await
    .expect_err("no attempt");
    assert!(matches!(err, retries_sqlx::Error::Stopped(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with("retry stopped") && !text.contains("database"),
        "{text}"
    );
}

/// The door's defaults under contention, as a new user writes them: 16
/// spawned workers, 400 transfers between two hot rows at SERIALIZABLE, a
/// 10 s deadline, no `.budget(..)`. Serialization failures and deadlocks
/// are the expected cost of SERIALIZABLE and draw no budget: at least 97 %
/// succeed (before: 27 of 400, every worker drawing on one process-wide
/// bucket), the total is conserved, and every failure says why.
#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_at_serializable_with_the_defaults() {
    let cluster = Cluster::start(&[]);
    let pool = pool(&cluster.url(), 16).await;
    pool.execute(
        "CREATE TABLE hot (id int PRIMARY KEY, balance bigint NOT NULL); \
         INSERT INTO hot VALUES (1, 100000), (2, 100000)",
    )
    .await
    .unwrap();
    let next = Arc::new(AtomicU32::new(0));
    let mut workers = Vec::new();
    for _ in 0..16 {
        let (pool, next) = (pool.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let policy = Policy::new(Duration::from_secs(10));
            let mut failures = Vec::new();
            let mut ok = 0u32;
            while next.fetch_add(1, Ordering::Relaxed) < 400 {
                let r = retries::call(&policy)
                    .transaction_fn(
                        retries_sqlx::Transaction::on(&pool).serializable(),
                        |tx: &mut Tx, _| {
                            Box::pin(async move {
                                sqlx::query("UPDATE hot SET balance = balance - 1 WHERE id = 1")
                                    .execute(&mut *tx)
                                    .await?;
                                sqlx::query("UPDATE hot SET balance = balance + 1 WHERE id = 2")
                                    .execute(&mut *tx)
                                    .await?;
                                Ok::<_, sqlx::Error>(())
                            })
                        },
                    )
                    .await;
                match r {
                    Ok(()) => ok += 1,
                    Err(e) => failures.push(e.to_string()),
                }
            }
            (ok, failures)
        }));
    }
    let (mut ok, mut failures) = (0, Vec::new());
    for w in workers {
        let (o, f) = w.await.unwrap();
        ok += o;
        failures.extend(f);
    }
    assert_eq!(ok as usize + failures.len(), 400);
    assert!(ok >= 388, "{ok} of 400 succeeded; failures: {failures:?}");
    for f in &failures {
        assert!(
            f.contains("could not serialize")
                || f.contains("deadlock")
                || f.contains("retry stopped"),
            "a failure names its reason: {f}"
        );
    }
    let total: i64 = sqlx::query_scalar("SELECT sum(balance)::bigint FROM hot")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(total, 200_000, "conserved");
    let moved: i64 = sqlx::query_scalar("SELECT balance FROM hot WHERE id = 2")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        moved - 100_000,
        i64::from(ok),
        "each success moved one, once"
    );
}
