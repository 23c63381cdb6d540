//! The chaos demo (`cargo run -p retries-payments --example chaos`): every
//! fault kind of `retries::chaos` at 20 % on the charge path of a payments
//! service that does **not** deduplicate, over gRPC (this crate's service,
//! tonic) and over HTTP (an axum charges service), against two callers:
//!
//! * **naive**: a hand-written loop as found in the field, any error retried
//!   with the same request, `attempts` attempts;
//! * **retries**: `retries` with the charge declared not idempotent and
//!   `reconcile` by the call's idempotency key (a look-up the faults do not
//!   touch: they are scoped to the charge), the same number of attempts.
//!
//! Every charge the service makes is reported to the `Chaos`
//! ([`Chaos::effect`]), so each run tells calls, effects and duplicate
//! effects.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use http::header::HeaderName;
use retries::{Policy, Verdict};
use retries_chaos::{Chaos, Fault, FaultLayer, Report, Rule};
use retries_reqwest::RetryMiddleware;
use tonic::Code;

use crate::{Client, Ledger, serve_with_faults};

/// The rate of each fault kind.
pub const RATE: f64 = 0.2;

/// Every fault kind at [`RATE`], on requests matching `scope`: a 20 ms
/// delay, a hang of at most 100 ms (or to the caller's deadline), a refusal
/// before the work, the reply dropped after the work, and an error
/// (HTTP 503, gRPC `UNAVAILABLE`) after the work.
///
/// # Panics
///
/// Never: the rules are valid.
#[must_use]
pub fn every_kind(seed: u64, scope: &str) -> Chaos {
    [
        Fault::Delay(Duration::from_millis(20)),
        Fault::Hang {
            max: Duration::from_millis(100),
        },
        Fault::Refuse { retry_after: None },
        Fault::DropReply,
        Fault::FAIL_AFTER,
    ]
    .into_iter()
    .fold(Chaos::builder().seed(seed), |b, f| {
        b.rule(Rule::new(f).rate(RATE).only([scope]))
    })
    .build()
    .expect("valid rules")
}

/// Who makes the calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// A hand-written loop that retries every error with the same request.
    Naive,
    /// `retries`, not idempotent, `reconcile` by key.
    Retries,
}

impl Caller {
    /// Its name in the table.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Naive => "naive loop",
            Self::Retries => "retries + reconcile",
        }
    }
}

/// One run: what the callers got and what the service did.
#[derive(Debug, Clone)]
pub struct Tally {
    /// `gRPC` or `HTTP`.
    pub protocol: &'static str,
    /// Who called.
    pub caller: Caller,
    /// Calls made.
    pub calls: u32,
    /// Calls that returned a charge.
    pub ok: u32,
    /// The service's counts: requests, effects (charges), duplicate
    /// effects, faults injected and observed.
    pub report: Report,
}

/// The policy of both callers' retries: `attempts` attempts, 100 ms apart,
/// within 5 s.
fn policy(attempts: u32) -> Policy {
    Policy::new(Duration::from_secs(5))
        .with_max_attempts(attempts)
        .with_backoff(retries::backoff::Backoff::constant(Duration::from_millis(
            100,
        )))
}

/// `calls` charges over gRPC by `caller`, `attempts` attempts each, under
/// [`every_kind`] with `seed`.
pub async fn grpc(caller: Caller, calls: u32, attempts: u32, seed: u64) -> Tally {
    let chaos = every_kind(seed, "/payments.Payments/Charge");
    let ledger = Ledger::reporting_to(chaos.clone());
    let client = Client::new(serve_with_faults(ledger, chaos.clone()).await);
    let policy = policy(attempts);
    let mut ok = 0;
    for _ in 0..calls {
        let charged = match caller {
            Caller::Naive => client.charge_naive(100, attempts).await,
            Caller::Retries => client.charge_reconciled(&policy, 100).await,
        };
        ok += u32::from(charged.is_ok());
    }
    Tally {
        protocol: "gRPC",
        caller,
        calls,
        ok,
        report: chaos.report(),
    }
}

/// The HTTP charges service: `POST /charges` charges the key in its
/// `idempotency-key` header (without deduplicating), `GET /charges/{key}`
/// says whether it was charged; `chaos` injects on the charges.
async fn serve_http(chaos: Chaos) -> SocketAddr {
    type Books = Arc<Mutex<HashMap<String, u32>>>;
    let charge = |State((books, chaos)): State<(Books, Chaos)>, headers: HeaderMap| async move {
        let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
            return (StatusCode::BAD_REQUEST, "no idempotency-key");
        };
        *books
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.to_string())
            .or_default() += 1;
        chaos.effect(key);
        (StatusCode::OK, "charged")
    };
    let lookup = |State((books, _)): State<(Books, Chaos)>, Path(key): Path<String>| async move {
        if books
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&key)
        {
            StatusCode::OK
        } else {
            StatusCode::NOT_FOUND
        }
    };
    let books: Books = Arc::default();
    let app = Router::new()
        .route("/charges", post(charge))
        .route("/charges/{key}", get(lookup))
        .with_state((books, chaos.clone()))
        .layer(FaultLayer::new(chaos));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    addr
}

/// `calls` charges over HTTP by `caller`, `attempts` attempts each, under
/// [`every_kind`] with `seed`.
///
/// # Panics
///
/// Never for a loopback address.
pub async fn http(caller: Caller, calls: u32, attempts: u32, seed: u64) -> Tally {
    let chaos = every_kind(seed, "POST /charges");
    let addr = serve_http(chaos.clone()).await;
    let url = format!("http://{addr}/charges");
    let plain = reqwest::Client::new();
    let key_header = HeaderName::from_static("idempotency-key");
    let lookup = plain.clone();
    let base = format!("http://{addr}");
    let client = reqwest_middleware::ClientBuilder::new(plain.clone())
        .with(
            RetryMiddleware::new(policy(attempts))
                .send_key(key_header)
                .reconcile(move |key, _request| {
                    let (client, url) = (lookup.clone(), format!("{base}/charges/{key}"));
                    async move {
                        let found = client.get(url).send().await?;
                        Ok(found.status().is_success().then_some(found))
                    }
                }),
        )
        .build();
    let mut ok = 0;
    for _ in 0..calls {
        let charged = match caller {
            Caller::Naive => naive_http(&plain, &url, attempts).await,
            Caller::Retries => client
                .post(&url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success()),
        };
        ok += u32::from(charged);
    }
    Tally {
        protocol: "HTTP",
        caller,
        calls,
        ok,
        report: chaos.report(),
    }
}

/// The hand-written HTTP loop: the same key on every attempt, any error or
/// status other than 2xx retried after 100 ms, 2 s per attempt.
async fn naive_http(client: &reqwest::Client, url: &str, attempts: u32) -> bool {
    let key = retries::IdempotencyKey::random().to_string();
    for attempt in 0..attempts {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let sent = client
            .post(url)
            .header("idempotency-key", &key)
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        if sent.is_ok_and(|r| r.status().is_success()) {
            return true;
        }
    }
    false
}

impl Client {
    /// Not idempotent, an unknown outcome reconciled by key, under `policy`.
    /// A reset stream reaches a tonic client as `INTERNAL` (the reply was
    /// lost after the charge): this caller counts `INTERNAL` as unknown, and
    /// its `reconcile` resolves it.
    pub async fn charge_reconciled(
        &self,
        policy: &Policy,
        cents: u64,
    ) -> Result<crate::pb::Receipt, tonic::Status> {
        retries::call(policy)
            .not_idempotent()
            .classify(|s: &tonic::Status| match s.code() {
                Code::Internal => Verdict::unknown(),
                _ => retries::tonic::classify_status(s),
            })
            .reconcile(|key| self.lookup(key))
            .run(async |at: &retries::Attempt| self.send(at, cents).await)
            .await
    }
}
