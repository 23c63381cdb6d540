//! Idempotency-key records in PostgreSQL: [`PgKeyStore`].

use std::time::Duration;

use retries_dedup::{
    Claim, Claimed, Completed, Fingerprint, Key, Store, StoreError, Stored, Terms, Token,
};
use sqlx_core::executor::Executor;
use sqlx_postgres::{PgPool, Postgres};

/// The table: one row per principal and key.
const MIGRATE: &str = "CREATE TABLE IF NOT EXISTS retries_idempotency_keys (
    principal text NOT NULL,
    key text NOT NULL,
    fingerprint text NOT NULL,
    token bigint NOT NULL,
    done boolean NOT NULL DEFAULT false,
    lease_until timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    status integer,
    headers bytea,
    body bytea,
    trailers bytea,
    body_dropped boolean NOT NULL DEFAULT false,
    PRIMARY KEY (principal, key)
)";

/// How long a statement of the store waits for a row another transaction
/// holds, at most: 1 s, PostgreSQL's `lock_timeout` set for that statement
/// alone (`set_config(…, true)` in a statement outside a transaction block
/// lasts until the statement ends; as a `FROM` item it is made before any
/// row is locked). A handler's transaction that stored its answer with
/// [`PgKeyStore::complete_in`] holds its key's row until it commits, and no
/// claim, renewal or release may wait on it without limit. A claim that
/// times out is answered "in progress"; a renewal that does is taken as
/// held (the row is locked by the holder's own transaction, which is
/// finishing the key).
macro_rules! bounded {
    () => {
        "(SELECT set_config('lock_timeout', '1000ms', true)) AS bounded"
    };
}

/// Take the key: a new row, or a row whose lease ran out with no answer
/// (for the same request) or whose retention ended (for any request). No
/// row back: the key is held or done; [`LOOK`] says which.
const CLAIM: &str = concat!(
    "INSERT INTO retries_idempotency_keys AS k
    (principal, key, fingerprint, token, lease_until, expires_at)
    SELECT $1, $2, $3, $4, now() + make_interval(secs => $5), now() + make_interval(secs => $6)
    FROM ",
    bounded!(),
    "
    ON CONFLICT (principal, key) DO UPDATE
    SET fingerprint = EXCLUDED.fingerprint, token = EXCLUDED.token, done = false,
        lease_until = EXCLUDED.lease_until, expires_at = EXCLUDED.expires_at,
        status = NULL, headers = NULL, body = NULL, trailers = NULL, body_dropped = false
    WHERE k.expires_at <= now()
       OR (NOT k.done AND k.lease_until <= now() AND k.fingerprint = EXCLUDED.fingerprint)
    RETURNING token"
);

/// A key held or done: its request, state, lease left (s) and answer.
const LOOK: &str = "SELECT fingerprint, done,
    GREATEST(EXTRACT(EPOCH FROM lease_until - now()), 0)::float8,
    status, headers, body, trailers, body_dropped
    FROM retries_idempotency_keys WHERE principal = $1 AND key = $2 AND expires_at > now()";

/// The answer, if the token holds the key: in the handler's transaction
/// ([`PgKeyStore::complete_in`]), under that transaction's own limits (the
/// transaction door bounds each statement by the attempt's time left).
const COMPLETE_IN: &str = "UPDATE retries_idempotency_keys
    SET done = true, status = $4, headers = $5, body = $6, trailers = $7, body_dropped = $8,
        expires_at = now() + make_interval(secs => $9)
    WHERE principal = $1 AND key = $2 AND token = $3 AND NOT done";

/// The answer, if the token holds the key, stored by the layer after the
/// handler (on the pool, its wait bounded).
const COMPLETE: &str = concat!(
    "UPDATE retries_idempotency_keys
    SET done = true, status = $4, headers = $5, body = $6, trailers = $7, body_dropped = $8,
        expires_at = now() + make_interval(secs => $9)
    FROM ",
    bounded!(),
    "
    WHERE principal = $1 AND key = $2 AND token = $3 AND NOT done"
);

/// The key given up, if the token holds it.
const RELEASE: &str = concat!(
    "DELETE FROM retries_idempotency_keys USING ",
    bounded!(),
    "
    WHERE principal = $1 AND key = $2 AND token = $3 AND NOT done"
);

/// A running claim's lease, extended if the token holds it.
const RENEW: &str = concat!(
    "UPDATE retries_idempotency_keys
    SET lease_until = now() + make_interval(secs => $4),
        expires_at = GREATEST(expires_at, now() + make_interval(secs => $4))
    FROM ",
    bounded!(),
    "
    WHERE principal = $1 AND key = $2 AND token = $3 AND NOT done"
);

/// Expired rows, a bounded batch; a row a transaction holds is left for
/// the next collection (it waits on no lock).
const COLLECT: &str = "DELETE FROM retries_idempotency_keys WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM retries_idempotency_keys WHERE expires_at <= now()
    LIMIT 10000 FOR UPDATE SKIP LOCKED))";

/// The pause a request is told to take when the key's row was locked.
const LOCKED: Duration = Duration::from_secs(1);

/// PostgreSQL's `lock_not_available`: the statement's lock wait ([`bounded!`]) ran out.
fn lock_timed_out(e: &sqlx_core::error::Error) -> bool {
    e.as_database_error()
        .and_then(sqlx_core::error::DatabaseError::code)
        .is_some_and(|c| c == "55P03")
}

/// Storing a record in the handler's transaction failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The claim is no longer this run's (its lease ran out and another
    /// request took the key, or the answer is stored already): roll the
    /// transaction back.
    #[error("the idempotency key's claim is no longer this request's")]
    NotHeld,
    /// The statement failed (the transaction is aborted).
    #[error(transparent)]
    Database(#[from] sqlx_core::error::Error),
}

/// Idempotency-key records in PostgreSQL, shared by every replica:
/// a [`Store`] for `retries_tower::dedup::IdempotencyLayer`.
///
/// One table, `retries_idempotency_keys` (made by [`PgKeyStore::migrate`]),
/// one row per key and principal. Each step is one statement, so two replicas
/// claiming a key at once get one claim between them (the primary key
/// decides), and every write is fenced by the claim's token: a run whose
/// lease passed to another request writes nothing.
///
/// **The record in the handler's transaction.** A handler that writes its
/// effect to the same database stores its answer in the same transaction
/// with [`PgKeyStore::complete_in`]: the effect and the record commit
/// together or not at all. If the claim is no longer the handler's (its
/// lease ran out and another request took the key), `complete_in` fails
/// with [`KeyError::NotHeld`] and the handler must not commit: its effect
/// is rolled back with it, and the run that holds the key does the work.
///
/// ```no_run
/// use http::{Response, StatusCode, header::CONTENT_TYPE};
/// use retries_dedup::{Claimed, Stored};
/// use retries_sqlx::PgKeyStore;
///
/// /// The handler's work; an axum handler takes `claim: Claimed` (feature `axum`
/// /// of `retries-tower`: a request without a key is then answered 400)
/// /// and returns the response (`response.map(axum::body::Body::from)`).
/// async fn charge(
///     pool: &sqlx::PgPool,
///     keys: &PgKeyStore,
///     claim: &Claimed,
///     cents: i64,
/// ) -> Result<Response<String>, Box<dyn std::error::Error + Send + Sync>> {
///     let mut tx = pool.begin().await?;
///     let id: i64 = sqlx::query_scalar("INSERT INTO charges (cents) VALUES ($1) RETURNING id")
///         .bind(cents)
///         .fetch_one(&mut *tx)
///         .await?;
///     // The answer first, then its record: the replay is this response.
///     let response = Response::builder()
///         .status(StatusCode::CREATED)
///         .header(CONTENT_TYPE, "text/plain")
///         .body(format!("charge {id}"))?;
///     // The record, in the charge's transaction: both or neither. An
///     // error here drops `tx`, which rolls the charge back.
///     keys.complete_in(&mut *tx, claim, &Stored::from_response(&response)).await?;
///     tx.commit().await?;
///     Ok(response)
/// }
/// ```
///
/// Inside the transaction door (`Transactions::transaction`), call
/// `complete_in` with the door's [`Tx`](crate::Tx) the same way: a rerun
/// of the transaction writes the record again in the new transaction.
///
/// **No statement waits on a lock without limit.** Once `complete_in` has
/// run, the handler's transaction holds the key's row until it commits or
/// rolls back. The store's own statements wait for such a row at most one
/// second (`lock_timeout`, set for that statement alone): a claim that
/// times out is answered "in progress" (409, `Retry-After: 1`), a renewal
/// that does counts as held (the lock keeps every other request out until
/// that transaction ends), and the collection of expired rows skips locked
/// ones. `complete_in` itself runs under your transaction's limits: inside
/// the transaction door every statement is bounded by the attempt's time
/// left, and the transaction is ended by the server if it sits idle past
/// it.
///
/// Times are the server's (`now()`), so replicas with skewed clocks agree.
/// Expired rows are deleted by [`Store::collect`], 10,000 at a time.

#[derive(Debug, Clone)]
pub struct PgKeyStore {
    pool: PgPool,
}

/// Row of [`LOOK`].
type Looked = (
    String,
    bool,
    f64,
    Option<i32>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    bool,
);

fn backend(e: sqlx_core::error::Error) -> StoreError {
    StoreError::Backend(Box::new(e))
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl PgKeyStore {
    /// Records in `pool`'s database (run [`migrate`](Self::migrate) once).
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Create the table if it is not there.
    pub async fn migrate(&self) -> Result<(), sqlx_core::error::Error> {
        sqlx_core::query::query(MIGRATE)
            .execute(&self.pool)
            .await
            .map(drop)
    }

    /// Store `answer` as the record of `claim`'s key in the handler's own
    /// transaction (`executor`: `&mut *tx`), fenced by the claim's token,
    /// and tell the layer it is stored. Commit only if this succeeds.
    pub async fn complete_in<'c, E>(
        &self,
        executor: E,
        claim: &Claimed,
        answer: &Stored,
    ) -> Result<(), KeyError>
    where
        E: Executor<'c, Database = Postgres>,
    {
        let key = claim.key();
        let done = complete_query(COMPLETE_IN, key, claim.token(), answer, claim.terms())
            .execute(executor)
            .await?;
        if done.rows_affected() == 0 {
            return Err(KeyError::NotHeld);
        }
        claim.mark_stored();
        Ok(())
    }

    async fn claim_now(&self, key: Key<'_>, terms: Terms) -> Result<Claim, StoreError> {
        // A row may expire or be released between the two statements: then
        // the claim is tried again (twice at most, then "in progress").
        for _ in 0..2 {
            let token = Token::random();
            let took: Result<Option<(i64,)>, _> = sqlx_core::query_as::query_as(CLAIM)
                .bind(key.principal)
                .bind(key.key)
                .bind(key.fingerprint.as_str())
                .bind(token.raw().cast_signed())
                .bind(secs(terms.lease))
                .bind(secs(terms.lease.max(terms.retention)))
                .fetch_optional(&self.pool)
                .await;
            let took = match took {
                // The row is held by a transaction (the holder's, storing
                // its answer): in progress, and soon decided.
                Err(e) if lock_timed_out(&e) => {
                    return Ok(Claim::InProgress {
                        retry_after: LOCKED,
                    });
                }
                took => took.map_err(backend)?,
            };
            if took.is_some() {
                return Ok(Claim::Run(token));
            }
            let looked: Option<Looked> = sqlx_core::query_as::query_as(LOOK)
                .bind(key.principal)
                .bind(key.key)
                .fetch_optional(&self.pool)
                .await
                .map_err(backend)?;
            let Some((
                fingerprint,
                done,
                lease_left,
                status,
                headers,
                body,
                trailers,
                body_dropped,
            )) = looked
            else {
                continue;
            };
            if Fingerprint::from_stored(fingerprint) != *key.fingerprint {
                return Ok(Claim::Mismatch);
            }
            if !done {
                return Ok(Claim::InProgress {
                    retry_after: Duration::from_secs_f64(lease_left.max(0.0)),
                });
            }
            return Ok(Claim::Answered(Stored {
                status: status
                    .and_then(|s| u16::try_from(s).ok())
                    .ok_or(StoreError::Corrupt("a done record without a status"))?,
                headers: Stored::decode_headers(&headers.unwrap_or_default())?,
                body: body.unwrap_or_default(),
                trailers: Stored::decode_headers(&trailers.unwrap_or_default())?,
                body_dropped,
            }));
        }
        Ok(Claim::InProgress {
            retry_after: Duration::from_secs(1),
        })
    }
}

fn complete_query<'q>(
    sql: &'static str,
    key: Key<'q>,
    token: Token,
    answer: &'q Stored,
    terms: Terms,
) -> sqlx_core::query::Query<'q, Postgres, sqlx_postgres::PgArguments> {
    sqlx_core::query::query(sql)
        .bind(key.principal)
        .bind(key.key)
        .bind(token.raw().cast_signed())
        .bind(i32::from(answer.status))
        .bind(Stored::encode_headers(&answer.headers))
        .bind(&answer.body[..])
        .bind(Stored::encode_headers(&answer.trailers))
        .bind(answer.body_dropped)
        .bind(secs(terms.retention))
}

impl Store for PgKeyStore {
    fn claim(
        &self,
        key: Key<'_>,
        terms: Terms,
    ) -> impl std::future::Future<Output = Result<Claim, StoreError>> + Send {
        self.claim_now(key, terms)
    }

    async fn complete(
        &self,
        key: Key<'_>,
        token: Token,
        answer: &Stored,
        terms: Terms,
    ) -> Result<Completed, StoreError> {
        let done = complete_query(COMPLETE, key, token, answer, terms)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(if done.rows_affected() == 0 {
            Completed::NotHeld
        } else {
            Completed::Stored
        })
    }

    async fn release(&self, key: Key<'_>, token: Token) -> Result<(), StoreError> {
        sqlx_core::query::query(RELEASE)
            .bind(key.principal)
            .bind(key.key)
            .bind(token.raw().cast_signed())
            .execute(&self.pool)
            .await
            .map_err(backend)
            .map(drop)
    }

    async fn renew(&self, key: Key<'_>, token: Token, terms: Terms) -> Result<bool, StoreError> {
        let renewed = sqlx_core::query::query(RENEW)
            .bind(key.principal)
            .bind(key.key)
            .bind(token.raw().cast_signed())
            .bind(secs(terms.lease))
            .execute(&self.pool)
            .await;
        match renewed {
            Ok(renewed) => Ok(renewed.rows_affected() == 1),
            // The row is locked: by the holder's own transaction, which has
            // stored the answer and is committing it (a claim by another
            // request locks it for one statement, and the next renewal
            // sees it). Not lost: the lock itself keeps every other request
            // out until that transaction ends.
            Err(e) if lock_timed_out(&e) => Ok(true),
            Err(e) => Err(backend(e)),
        }
    }

    async fn collect(&self) -> Result<usize, StoreError> {
        let gone = sqlx_core::query::query(COLLECT)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(gone.rows_affected() as usize)
    }
}
