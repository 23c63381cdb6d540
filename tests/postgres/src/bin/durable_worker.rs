//! A worker process of the durable-calls proof (`tests/durable.rs`): it
//! runs `retries_sqlx::durable::Worker` on the database until it is
//! killed, its handler charging by key on the test's charge server (raw
//! HTTP/1.1 over loopback, one connection per attempt).
//!
//! `durable_worker DB_URL CHARGE_ADDR MODE LEASE_MS`, `MODE` one of:
//! * `dedup`: the server deduplicates by key; the handler is idempotent
//!   (an unknown outcome is sent again with the same key);
//! * `reconcile`: the server does not; the handler is not idempotent and
//!   asks the server whether the key was charged before anything is sent
//!   again.

use std::net::SocketAddr;
use std::time::Duration;

use retries::{Attempt, IdempotencyKey, Policy, Verdict};
use retries_sqlx::durable::{Call, Handler, HandlerError, Worker};
use sqlx::postgres::PgPoolOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const POLICY: Policy = Policy::new(Duration::from_secs(5))
    .with_max_attempts(6)
    .with_attempt_timeout(Duration::from_millis(500))
    .validated();

/// One request; the status line's code and the body, or the verdict of
/// what failed.
async fn request(
    addr: SocketAddr,
    method: &str,
    key: IdempotencyKey,
) -> Result<(u16, String), HandlerError> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| HandlerError::new(Verdict::not_executed(), format!("connect: {e}")))?;
    let path = if method == "GET" { "charges" } else { "charge" };
    s.write_all(format!("{method} /{path}/{key} HTTP/1.1\r\nhost: charge\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .map_err(|e| HandlerError::new(Verdict::unknown(), format!("write: {e}")))?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .await
        .map_err(|e| HandlerError::new(Verdict::unknown(), format!("read: {e}")))?;
    let code = answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            HandlerError::new(
                Verdict::unknown(),
                "the connection closed without an answer",
            )
        })?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

async fn charge(addr: SocketAddr, at: &Attempt) -> Result<(), HandlerError> {
    match request(addr, "POST", at.idempotency_key()).await? {
        (200, _) => Ok(()),
        (code, _) => Err(HandlerError::new(
            Verdict::unknown(),
            format!("status {code}"),
        )),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, addr, mode, lease] = &args[..] else {
        panic!("usage: durable_worker DB_URL CHARGE_ADDR dedup|reconcile LEASE_MS");
    };
    let addr: SocketAddr = addr.parse().expect("CHARGE_ADDR");
    let lease = Duration::from_millis(lease.parse().expect("LEASE_MS"));
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy(url)
        .expect("a pool");
    let handler = match mode.as_str() {
        "dedup" => Handler::idempotent(POLICY, async move |_: &Call, at: &Attempt| {
            charge(addr, at).await
        }),
        "reconcile" => Handler::not_idempotent(POLICY, async move |_: &Call, at: &Attempt| {
            charge(addr, at).await
        })
        .reconcile(async move |call: &Call| {
            match request(addr, "GET", call.key()).await? {
                (200, body) => Ok::<bool, HandlerError>(body.trim() != "0"),
                (code, _) => Err(HandlerError::new(
                    Verdict::not_executed(),
                    format!("look-up status {code}"),
                )),
            }
        }),
        other => panic!("unknown mode {other}"),
    };
    Worker::new(pool)
        .handle("charge", handler)
        .lease(lease)
        .concurrency(16)
        .poll(Duration::from_millis(50))
        .run(std::future::pending())
        .await
        .expect("the worker");
}
