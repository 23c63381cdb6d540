//! Demo and tests only: a real gRPC payments service (tonic, on loopback) that
//! counts how many times `Charge` really charged, with fault injection, and
//! clients retried by `retries`. It reproduces the reference table of the
//! specification (SPEC §13): no row charges more than once.
//!
//! The server deliberately does **not** deduplicate by idempotency key, so a
//! blind retry of a charge that happened charges again, as in the field.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use retries::{IdempotencyKey, Verdict, retryable};
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};

pub mod chaos;
pub mod events;
pub mod overload;

/// The generated protobuf and gRPC code.
#[allow(missing_docs, unreachable_pub, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("payments");
}

use pb::payments_client::PaymentsClient;
use pb::payments_server::{Payments, PaymentsServer};
use pb::{ChargeRequest, GetChargeRequest, Receipt};

/// The metadata key under which a client may send the charge's idempotency
/// key instead of in the message.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// What the server does on one `Charge` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer UNAVAILABLE before charging (the handler did not run).
    UnavailableBefore,
    /// Charge, then answer INTERNAL.
    InternalAfter,
    /// Charge, then answer UNAVAILABLE (the reply was lost).
    UnavailableAfter,
    /// Sleep, then answer UNAVAILABLE without charging.
    SleepThenUnavailable(Duration),
    /// Answer `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms` set to this value.
    Pushback(&'static str),
}

/// The server's books: faults to inject, charges made, calls received.
#[derive(Debug, Default)]
pub struct Ledger {
    faults: Mutex<VecDeque<Fault>>,
    charges: Mutex<HashMap<String, Vec<u64>>>,
    charge_calls: AtomicU32,
    previous_attempts: Mutex<Vec<Option<String>>>,
    /// Told of each charge made (its key), when faults are injected.
    chaos: Option<retries_chaos::Chaos>,
}

impl Ledger {
    /// A ledger that injects `faults` on the first calls, in order.
    #[must_use]
    pub fn with_faults(faults: &[Fault]) -> Arc<Self> {
        Arc::new(Self {
            faults: Mutex::new(faults.iter().copied().collect()),
            ..Self::default()
        })
    }

    /// A ledger that reports each charge, by its idempotency key, to
    /// `chaos` ([`retries_chaos::Chaos::effect`]).
    #[must_use]
    pub fn reporting_to(chaos: retries_chaos::Chaos) -> Arc<Self> {
        Arc::new(Self {
            chaos: Some(chaos),
            ..Self::default()
        })
    }

    /// The `grpc-previous-rpc-attempts` header of each `Charge` call received.
    pub fn previous_attempts(&self) -> Vec<Option<String>> {
        self.previous_attempts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// `Charge` calls received (attempts that reached the server).
    pub fn charge_calls(&self) -> u32 {
        self.charge_calls.load(Ordering::SeqCst)
    }

    /// Times the card was really charged, over all keys.
    pub fn charges(&self) -> usize {
        self.charges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .map(Vec::len)
            .sum()
    }
}

/// The service.
#[derive(Debug)]
struct Service {
    ledger: Arc<Ledger>,
}

fn receipt(key: &str, cents: u64) -> Receipt {
    let budget = retries::scope::remaining().map_or(0, |d| d.as_millis() as u64);
    Receipt {
        id: format!("receipt-{key}"),
        cents,
        server_budget_ms: budget,
    }
}

#[tonic::async_trait]
impl Payments for Service {
    async fn charge(&self, request: Request<ChargeRequest>) -> Result<Response<Receipt>, Status> {
        self.ledger.charge_calls.fetch_add(1, Ordering::SeqCst);
        let previous = request
            .metadata()
            .get(retries::tonic::PREVIOUS_ATTEMPTS)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        self.ledger.previous_attempts.lock().unwrap().push(previous);
        // A key sent as metadata (by a client-side layer) takes precedence
        // over the one in the message.
        let wire_key = request
            .metadata()
            .get(IDEMPOTENCY_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut req = request.into_inner();
        if let Some(key) = wire_key {
            req.idempotency_key = key;
        }
        let fault = self.ledger.faults.lock().unwrap().pop_front();
        match fault {
            Some(Fault::UnavailableBefore) => return Err(Status::unavailable("not ready")),
            Some(Fault::SleepThenUnavailable(d)) => {
                tokio::time::sleep(d).await;
                return Err(Status::unavailable("replica failed"));
            }
            Some(Fault::Pushback(ms)) => {
                let mut md = tonic::metadata::MetadataMap::new();
                md.insert(retries::tonic::PUSHBACK, ms.parse().expect("ascii"));
                return Err(Status::with_metadata(Code::ResourceExhausted, "quota", md));
            }
            _ => {}
        }
        self.ledger
            .charges
            .lock()
            .unwrap()
            .entry(req.idempotency_key.clone())
            .or_default()
            .push(req.cents);
        if let Some(chaos) = &self.ledger.chaos {
            chaos.effect(&req.idempotency_key);
        }
        match fault {
            Some(Fault::InternalAfter) => {
                Err(Status::internal("ledger write failed after the charge"))
            }
            Some(Fault::UnavailableAfter) => {
                Err(Status::unavailable("connection lost after the charge"))
            }
            _ => Ok(Response::new(receipt(&req.idempotency_key, req.cents))),
        }
    }

    async fn get_charge(
        &self,
        request: Request<GetChargeRequest>,
    ) -> Result<Response<Receipt>, Status> {
        let key = request.into_inner().idempotency_key;
        let charges = self.ledger.charges.lock().unwrap();
        match charges.get(&key).and_then(|c| c.first()) {
            Some(cents) => Ok(Response::new(receipt(&key, *cents))),
            None => Err(Status::not_found("no charge with this key")),
        }
    }
}

/// Start the service on a loopback port; the server installs each request's
/// `grpc-timeout` as the scope of its handler ([`retries_tower::ServerLayer::grpc()`]).
///
/// # Panics
///
/// When no loopback port can be bound.
pub async fn serve(ledger: Arc<Ledger>) -> SocketAddr {
    spawn_server(PaymentsServer::new(Service { ledger })).await
}

/// Start the service behind [`retries_chaos::FaultLayer`] (outside the
/// deadline layer): `chaos`'s faults on every request in its scope.
///
/// # Panics
///
/// When no loopback port can be bound.
pub async fn serve_with_faults(ledger: Arc<Ledger>, chaos: retries_chaos::Chaos) -> SocketAddr {
    let (addr, incoming) = listen("127.0.0.1:0").await;
    tokio::spawn(async move {
        Server::builder()
            .layer(retries_chaos::FaultLayer::new(chaos))
            .layer(retries_tower::ServerLayer::grpc())
            .add_service(PaymentsServer::new(Service { ledger }))
            .serve_with_incoming(incoming)
            .await
            .expect("serve");
    });
    addr
}

/// Start the service behind `retries_tower::dedup::IdempotencyLayer` in
/// gRPC mode (an in-process key store, a `lease`), itself behind
/// [`retries_chaos::FaultLayer`]: each `idempotency-key` runs once, and a
/// lost reply is answered from its record.
///
/// # Panics
///
/// When no loopback port can be bound.
pub async fn serve_deduplicated(
    ledger: Arc<Ledger>,
    chaos: retries_chaos::Chaos,
    lease: Duration,
) -> SocketAddr {
    let (addr, incoming) = listen("127.0.0.1:0").await;
    let keys =
        retries_tower::dedup::IdempotencyLayer::new(retries_tower::dedup::MemoryStore::new())
            .grpc()
            .lease(lease);
    tokio::spawn(async move {
        Server::builder()
            .layer(retries_chaos::FaultLayer::new(chaos))
            .layer(keys)
            .layer(retries_tower::ServerLayer::grpc())
            .add_service(PaymentsServer::new(Service { ledger }))
            .serve_with_incoming(incoming)
            .await
            .expect("serve");
    });
    addr
}

/// A listener on `addr`: its address, and its connections as a stream.
async fn listen(addr: &str) -> (SocketAddr, tokio_stream::wrappers::TcpListenerStream) {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    (
        addr,
        tokio_stream::wrappers::TcpListenerStream::new(listener),
    )
}

/// Serve `service` on a loopback port, each request's `grpc-timeout`
/// installed as its handler's scope; returns the address.
async fn spawn_server<T: Payments>(service: PaymentsServer<T>) -> SocketAddr {
    spawn_server_with(service, retries_tower::ServerLayer::grpc(), "127.0.0.1:0").await
}

/// [`spawn_server`] behind `layer`, on `addr`.
async fn spawn_server_with<T: Payments>(
    service: PaymentsServer<T>,
    layer: retries_tower::ServerLayer,
    addr: &str,
) -> SocketAddr {
    let (addr, incoming) = listen(addr).await;
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(service)
            .serve_with_incoming(incoming)
            .await
            .expect("serve");
    });
    addr
}

/// A hop of a chain: its `Charge` handler forwards to the next service with
/// [`Client::forward`] (three attempts, as a user writes it), and answers
/// with the status it got when that gives up (a handler that knows nothing
/// of the marker). What each call saw of its deadline is kept.
#[derive(Debug)]
struct Hop {
    downstream: Client,
    deadlines: Arc<Mutex<Vec<Option<Duration>>>>,
}

#[tonic::async_trait]
impl Payments for Hop {
    async fn charge(&self, request: Request<ChargeRequest>) -> Result<Response<Receipt>, Status> {
        self.deadlines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(retries::scope::remaining());
        let cents = request.into_inner().cents;
        self.downstream.forward(cents).await.map(Response::new)
    }

    async fn get_charge(&self, _: Request<GetChargeRequest>) -> Result<Response<Receipt>, Status> {
        Err(Status::unimplemented("a hop keeps no books"))
    }
}

/// A running hop: its address, and the deadline each call it handled saw at
/// its handler's entry.
#[derive(Debug, Clone)]
pub struct HopHandle {
    /// Where it listens.
    pub addr: SocketAddr,
    deadlines: Arc<Mutex<Vec<Option<Duration>>>>,
}

impl HopHandle {
    /// The remaining time each handled call's scope had at entry.
    #[must_use]
    pub fn deadlines(&self) -> Vec<Option<Duration>> {
        self.deadlines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Start a hop forwarding to `downstream`, behind `layer`, on `addr`
/// (`127.0.0.1:0` for a free port).
///
/// # Panics
///
/// When `addr` cannot be bound.
pub async fn serve_hop(
    downstream: SocketAddr,
    layer: retries_tower::ServerLayer,
    addr: &str,
) -> HopHandle {
    let deadlines = Arc::default();
    let hop = Hop {
        downstream: Client::new(downstream),
        deadlines: Arc::clone(&deadlines),
    };
    let addr = spawn_server_with(PaymentsServer::new(hop), layer, addr).await;
    HopHandle { addr, deadlines }
}

/// Start a store that is down: every `Charge` answers UNAVAILABLE (after
/// `slow`, when not zero), counted in the returned ledger; behind `layer`,
/// on `addr`.
///
/// # Panics
///
/// When `addr` cannot be bound.
pub async fn serve_dead_store(
    layer: retries_tower::ServerLayer,
    addr: &str,
    slow: Duration,
) -> (SocketAddr, Arc<Ledger>) {
    let fault = if slow.is_zero() {
        Fault::UnavailableBefore
    } else {
        Fault::SleepThenUnavailable(slow)
    };
    let ledger = Ledger::with_faults(&vec![fault; 100_000]);
    let service = Service {
        ledger: Arc::clone(&ledger),
    };
    (
        spawn_server_with(PaymentsServer::new(service), layer, addr).await,
        ledger,
    )
}

/// A relay (service A) whose `Charge` handler forwards to another payments
/// service (B) with retries of its own: under [`retries_tower::ServerLayer::grpc()`]
/// those retries are bounded by A's caller's deadline, and each request to B
/// carries the time A has left.
#[derive(Debug)]
struct Relay {
    downstream: Client,
}

#[tonic::async_trait]
impl Payments for Relay {
    async fn charge(&self, request: Request<ChargeRequest>) -> Result<Response<Receipt>, Status> {
        let cents = request.into_inner().cents;
        self.downstream.relay(cents).await.map(Response::new)
    }

    async fn get_charge(&self, _: Request<GetChargeRequest>) -> Result<Response<Receipt>, Status> {
        Err(Status::unimplemented("a relay keeps no books"))
    }
}

/// Start a relay to the service at `downstream`; returns its address and the
/// client it uses (to count its attempts).
///
/// # Panics
///
/// When no loopback port can be bound.
pub async fn serve_relay(downstream: SocketAddr) -> (SocketAddr, Client) {
    let client = Client::new(downstream);
    let relay = Relay {
        downstream: client.clone(),
    };
    (spawn_server(PaymentsServer::new(relay)).await, client)
}

/// A client of the payments service, with the retry policies of the
/// reference table.
#[derive(Debug, Clone)]
pub struct Client {
    inner: PaymentsClient<Channel>,
    /// Attempts made by this client, counted on the client side.
    attempts: Arc<AtomicU32>,
}

/// Shared by the row that shows the threshold rule at first use.
static TOO_LOW: retries::CircuitBreaker = retries::CircuitBreaker::new(2, Duration::from_secs(30));

impl Client {
    /// A client for the service at `addr` (connects on first use).
    ///
    /// # Panics
    ///
    /// Never for a socket address.
    #[must_use]
    pub fn new(addr: SocketAddr) -> Self {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .expect("a valid URI")
            .connect_lazy();
        Self {
            inner: PaymentsClient::new(channel),
            attempts: Arc::default(),
        }
    }

    /// Attempts this client made.
    pub fn attempts(&self) -> u32 {
        self.attempts.load(Ordering::SeqCst)
    }

    async fn send(&self, at: &retries::Attempt, cents: u64) -> Result<Receipt, Status> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        let message = ChargeRequest {
            idempotency_key: at.idempotency_key().to_string(),
            cents,
        };
        let mut client = self.inner.clone();
        Ok(client
            .charge(retries::tonic::request(at, message))
            .await?
            .into_inner())
    }

    /// `reconcile`: did the charge with this key happen?
    async fn lookup(&self, key: IdempotencyKey) -> Result<Option<Receipt>, Status> {
        let mut client = self.inner.clone();
        let request = GetChargeRequest {
            idempotency_key: key.to_string(),
        };
        match client.get_charge(request).await {
            Ok(r) => Ok(Some(r.into_inner())),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(s),
        }
    }

    /// One idempotent call under `policy` (for callers that pick the deadline).
    pub async fn charge_within(
        &self,
        policy: &retries::Policy,
        cents: u64,
    ) -> Result<Receipt, Status> {
        retries::call(policy)
            .idempotent()
            .run(async |at: &retries::Attempt| self.send(at, cents).await)
            .await
    }

    /// The relay's forwarding: up to 50 attempts in 10 s, but never past the
    /// deadline of the request being relayed (its scope).
    #[retryable(deadline = "10s", max_attempts = 50, idempotent, attempt = at, nested = "own",
                budget = "none", backoff = "constant", initial_backoff = "100ms")]
    async fn relay(&self, cents: u64) -> Result<Receipt, Status> {
        self.send(at, cents).await
    }

    /// A hop's call to the next service, as a user writes it: three
    /// attempts, idempotent, within 5 s (and its caller's deadline).
    #[retryable(deadline = "5s", max_attempts = 3, idempotent, attempt = at, budget = "none",
                backoff = "constant", initial_backoff = "1ms")]
    pub async fn forward(&self, cents: u64) -> Result<Receipt, Status> {
        self.send(at, cents).await
    }

    /// One `Charge` with no deadline on the wire and no retries (a caller
    /// that will simply leave).
    pub async fn charge_without_deadline(&self, cents: u64) -> Result<Receipt, Status> {
        let message = ChargeRequest {
            idempotency_key: IdempotencyKey::random().to_string(),
            cents,
        };
        Ok(self.inner.clone().charge(message).await?.into_inner())
    }

    /// A hand-written loop, as found in the field: `attempts` attempts of
    /// 2 s each, any error retried after 100 ms, the same request (and key)
    /// every time.
    pub async fn charge_naive(&self, cents: u64, attempts: u32) -> Result<Receipt, Status> {
        let key = IdempotencyKey::random().to_string();
        let mut last = Status::unknown("no attempt");
        for attempt in 0..attempts {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            self.attempts.fetch_add(1, Ordering::SeqCst);
            let mut request = Request::new(ChargeRequest {
                idempotency_key: key.clone(),
                cents,
            });
            request.set_timeout(Duration::from_secs(2));
            match self.inner.clone().charge(request).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) => last = s,
            }
        }
        Err(last)
    }

    /// The recommended client: not idempotent, unknown outcomes reconciled by key.
    #[retryable(deadline = "2s", max_attempts = 3, idempotent = false, attempt = at,
                reconcile = |key| self.lookup(key), backoff = "constant", initial_backoff = "100ms")]
    pub async fn charge(&self, cents: u64) -> Result<Receipt, Status> {
        self.send(at, cents).await
    }

    /// The same, with INTERNAL marked transient by the user.
    #[retryable(deadline = "2s", max_attempts = 3, idempotent = false, attempt = at,
                reconcile = |key| self.lookup(key), backoff = "constant", initial_backoff = "100ms",
                classify = |s: &Status| match s.code() {
                    Code::Internal => Verdict::unknown(),
                    _ => retries::tonic::classify_status(s),
                })]
    pub async fn charge_internal_transient(&self, cents: u64) -> Result<Receipt, Status> {
        self.send(at, cents).await
    }

    /// Not idempotent, and nothing to reconcile with.
    #[retryable(deadline = "2s", max_attempts = 3, idempotent = false, attempt = at)]
    pub async fn charge_unreconciled(&self, cents: u64) -> Result<Receipt, Status> {
        self.send(at, cents).await
    }

    /// Declared idempotent (for the deadline row).
    #[retryable(deadline = "2s", max_attempts = 3, idempotent, attempt = at,
                backoff = "constant", initial_backoff = "100ms")]
    pub async fn charge_idempotent(&self, cents: u64) -> Result<Receipt, Status> {
        self.send(at, cents).await
    }

    /// With a breaker whose threshold is above `max_attempts`.
    #[retryable(deadline = "2s", max_attempts = 3, idempotent = false, attempt = at,
                reconcile = |key| self.lookup(key), backoff = "constant", initial_backoff = "100ms",
                breaker(failure_threshold = 5, open_for = "30s"))]
    pub async fn charge_with_breaker(&self, cents: u64) -> Result<Receipt, Status> {
        self.send(at, cents).await
    }

    /// With a shared breaker whose threshold (2) is not above `max_attempts`
    /// (3): reported at first use. (With literals in the attribute, the same
    /// mistake does not compile.)
    #[retryable(deadline = "2s", max_attempts = 3, idempotent, attempt = at,
                breaker = TOO_LOW, backoff = "constant", initial_backoff = "10ms")]
    pub async fn charge_misconfigured(&self, cents: u64) -> Result<Receipt, Status> {
        self.send(at, cents).await
    }
}

/// One row of the reference table: what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The scenario.
    pub scenario: &'static str,
    /// `OK` or the status code the caller got.
    pub result: String,
    /// Attempts the client made.
    pub attempts: u32,
    /// Times the server charged.
    pub charges: usize,
    /// Wall time of the call.
    pub elapsed: Duration,
}

/// The scenarios of the reference table, in order.
pub const SCENARIOS: [&str; 8] = [
    "UNAVAILABLE before the handler ran, then OK",
    "INTERNAL after the charge, default classification",
    "INTERNAL after the charge, user marks INTERNAL transient",
    "UNAVAILABLE after the charge, default",
    "UNAVAILABLE after the charge, not idempotent, no reconcile",
    "handler sleeps 1.5 s then UNAVAILABLE, deadline 2 s, idempotent",
    "breaker threshold 2 under 3 attempts",
    "breaker threshold 5, first attempt fails, second succeeds",
];

/// Run row `i` (0-based) of the reference table against a fresh server.
///
/// # Panics
///
/// When `i` is not a row.
pub async fn run_row(i: usize) -> Row {
    let faults: &[Fault] = match i {
        0 | 7 => &[Fault::UnavailableBefore],
        1 | 2 => &[Fault::InternalAfter],
        3 | 4 => &[Fault::UnavailableAfter],
        5 => &[Fault::SleepThenUnavailable(Duration::from_millis(1500)); 3],
        6 => &[Fault::UnavailableBefore; 3],
        _ => panic!("no row {i}"),
    };
    let ledger = Ledger::with_faults(faults);
    let client = Client::new(serve(ledger.clone()).await);
    let t0 = Instant::now();
    let result = match i {
        0 | 1 | 3 => client.charge(1999).await,
        2 => client.charge_internal_transient(1999).await,
        4 => client.charge_unreconciled(1999).await,
        5 => client.charge_idempotent(1999).await,
        6 => client.charge_misconfigured(1999).await,
        _ => client.charge_with_breaker(1999).await,
    };
    let elapsed = t0.elapsed();
    let result = match result {
        Ok(_) => "OK".to_string(),
        Err(s) if i == 6 && TOO_LOW.misconfiguration_reported() => {
            format!("{:?} (rejected at first use: reported)", s.code())
        }
        Err(s) => format!("{:?}", s.code()),
    };
    Row {
        scenario: SCENARIOS[i],
        result,
        attempts: client.attempts(),
        charges: ledger.charges(),
        elapsed,
    }
}
