//! `retries_sqlx::PgKeyStore` against a real PostgreSQL: one claim among
//! racing replicas, a lease run out passed on, the fence of a run that lost
//! its lease (after the handler and in its transaction), release, replay of
//! headers and trailers, and retention. Real time, short (a 300 ms lease, a
//! 1 s retention).

use std::time::Duration;

use retries_postgres_tests::Cluster;
use retries_sqlx::{KeyError, PgKeyStore};
use retries_tower::dedup::{Claim, Claimed, Completed, Fingerprint, Key, Store, Stored, Terms};
use sqlx::postgres::PgPoolOptions;

const TERMS: Terms = Terms {
    lease: Duration::from_millis(300),
    retention: Duration::from_secs(1),
};

/// For a test of claims that race, not of leases: a lease that cannot run
/// out while twenty claims are answered, however busy the machine. (With
/// `TERMS`, a claim answered more than 300 ms after the first took the key
/// over, as it should: CI saw two runs that way.)
const RACE: Terms = Terms {
    lease: Duration::from_mins(1),
    retention: Duration::from_mins(1),
};

fn answer(body: &str) -> Stored {
    Stored {
        status: 201,
        headers: vec![("content-type".into(), b"text/plain".to_vec())],
        body: body.as_bytes().to_vec(),
        trailers: vec![("grpc-status".into(), b"0".to_vec())],
        body_dropped: false,
    }
}

async fn setup() -> (Cluster, sqlx::PgPool, PgKeyStore) {
    let cluster = Cluster::start(&[]);
    let pool = PgPoolOptions::new()
        .max_connections(24)
        .connect(&cluster.url())
        .await
        .unwrap();
    sqlx::query("CREATE TABLE effects (key text NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let store = PgKeyStore::new(pool.clone());
    store.migrate().await.unwrap();
    store.migrate().await.unwrap(); // twice: idempotent
    (cluster, pool, store)
}

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_replicas_claiming_one_key_get_one_run_and_scopes_are_apart() {
    let (_cluster, _pool, store) = setup().await;
    let fp = Fingerprint::of("POST", "/charges", b"100");
    let claims = futures_util::future::join_all((0..20).map(|_| {
        let store = store.clone();
        let fp = fp.clone();
        async move {
            let key = Key {
                principal: "acme",
                key: "k1",
                fingerprint: &fp,
            };
            store.claim(key, RACE).await.unwrap()
        }
    }))
    .await;
    let runs = claims.iter().filter(|c| matches!(c, Claim::Run(_))).count();
    assert_eq!(runs, 1, "{claims:?}");
    assert!(
        claims
            .iter()
            .all(|c| matches!(c, Claim::Run(_) | Claim::InProgress { .. })),
        "{claims:?}"
    );
    let key = Key {
        principal: "acme",
        key: "k1",
        fingerprint: &fp,
    };
    // Another request under the key: a mismatch; another scope: its own key.
    let other = Fingerprint::of("POST", "/charges", b"999");
    let reused = Key {
        fingerprint: &other,
        ..key
    };
    assert_eq!(store.claim(reused, RACE).await.unwrap(), Claim::Mismatch);
    let elsewhere = Key {
        principal: "globex",
        ..key
    };
    assert!(matches!(
        store.claim(elsewhere, RACE).await.unwrap(),
        Claim::Run(_)
    ));
}

#[cfg_attr(
    no_postgres,
    ignore = "needs PostgreSQL's initdb and pg_ctl (13 or later): set PG_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_fenced_a_record_replays_and_is_forgotten_after_retention() {
    let (_cluster, pool, store) = setup().await;
    let fp = Fingerprint::of("POST", "/charges", b"100");
    let key = Key {
        principal: "acme",
        key: "k1",
        fingerprint: &fp,
    };
    let Claim::Run(first) = store.claim(key, TERMS).await.unwrap() else {
        panic!("a new key runs")
    };

    // Renewed while it runs, the claim outlives its first lease.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(store.renew(key, first, TERMS).await.unwrap());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(matches!(
        store.claim(key, TERMS).await.unwrap(),
        Claim::InProgress { .. }
    ));
    // No longer renewed, the lease runs out: the key passes to the next
    // request, and the first run cannot renew it back.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let Claim::Run(second) = store.claim(key, TERMS).await.unwrap() else {
        panic!("a lease run out passes the key on")
    };
    assert!(!store.renew(key, first, TERMS).await.unwrap());
    // The first run lost its lease: neither after its handler nor in its
    // transaction can it store its answer, and its effect rolls back.
    assert_eq!(
        store
            .complete(key, first, &answer("late"), TERMS)
            .await
            .unwrap(),
        Completed::NotHeld
    );
    let lost = Claimed::new(key, first, TERMS);
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO effects VALUES ('first')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let fenced = store.complete_in(&mut *tx, &lost, &answer("late")).await;
    assert!(matches!(fenced, Err(KeyError::NotHeld)), "{fenced:?}");
    assert!(!lost.is_stored());
    drop(tx); // rolled back, as the handler must

    // The run that holds the key stores its answer with its effect.
    let held = Claimed::new(key, second, TERMS);
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO effects VALUES ('second')")
        .execute(&mut *tx)
        .await
        .unwrap();
    store
        .complete_in(&mut *tx, &held, &answer("receipt"))
        .await
        .unwrap();
    assert!(held.is_stored());
    tx.commit().await.unwrap();
    let effects: Vec<(String,)> = sqlx::query_as("SELECT key FROM effects")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(effects, [("second".to_string(),)]);
    // Every later request gets the record, headers and trailers included.
    assert_eq!(
        store.claim(key, TERMS).await.unwrap(),
        Claim::Answered(answer("receipt"))
    );
    // Stored already (in the transaction): the layer's write after the
    // handler changes nothing.
    assert_eq!(
        store
            .complete(key, second, &answer("again"), TERMS)
            .await
            .unwrap(),
        Completed::NotHeld
    );

    // A released key runs again at once.
    let fresh = Key { key: "k2", ..key };
    let Claim::Run(t) = store.claim(fresh, TERMS).await.unwrap() else {
        panic!("a new key runs")
    };
    store.release(fresh, t).await.unwrap();
    assert!(matches!(
        store.claim(fresh, TERMS).await.unwrap(),
        Claim::Run(_)
    ));

    // Past its retention a record is collected, and its key is new again.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(store.collect().await.unwrap() >= 1);
    assert!(matches!(
        store.claim(key, TERMS).await.unwrap(),
        Claim::Run(_)
    ));
}
