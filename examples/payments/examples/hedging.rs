//! `cargo run --release -p retries-payments --example hedging`: hedging
//! against a real tonic server on loopback whose latency has a heavy tail
//! (one request in 50 takes 500 ms, the others 1 to 3 ms), driven by a gRPC
//! service config through the tower layer. Prints p50, p99, p99.9 and
//! requests per call for three runs of 2,000 calls (16 at a time): without
//! hedging, with hedging (`hedgingDelay` 20 ms, 3 copies at most), and with
//! hedging during a partial outage (a third of the requests answer
//! UNAVAILABLE at once), where `retryThrottling` caps the extra load.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use retries::Policy;
use retries_payments::pb::payments_client::PaymentsClient;
use retries_payments::pb::payments_server::{Payments, PaymentsServer};
use retries_payments::pb::{ChargeRequest, GetChargeRequest, Receipt};
use retries_tower::RetryLayer;
use retries_tower::service_config::ServiceConfig;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

const CALLS: usize = 2_000;
const CONCURRENCY: usize = 16;

/// A read whose latency has a heavy tail, and optionally fails fast.
struct Tail {
    requests: Arc<AtomicU64>,
    /// Every `failing`-th request answers UNAVAILABLE at once (0: never).
    failing: u64,
}

#[tonic::async_trait]
impl Payments for Tail {
    async fn charge(&self, _: Request<ChargeRequest>) -> Result<Response<Receipt>, Status> {
        Err(Status::unimplemented("reads only"))
    }

    async fn get_charge(&self, r: Request<GetChargeRequest>) -> Result<Response<Receipt>, Status> {
        let n = self.requests.fetch_add(1, Ordering::SeqCst);
        if self.failing > 0 && n % self.failing == 1 {
            return Err(Status::unavailable("replica down"));
        }
        // Deterministic: one request in 50 is slow; the rest 1 to 3 ms.
        let latency = if n % 50 == 7 { 500 } else { 1 + n % 3 };
        tokio::time::sleep(Duration::from_millis(latency)).await;
        Ok(Response::new(Receipt {
            id: r.into_inner().idempotency_key,
            cents: 0,
            server_budget_ms: 0,
        }))
    }
}

async fn serve(failing: u64) -> (SocketAddr, Arc<AtomicU64>) {
    let requests = Arc::new(AtomicU64::new(0));
    let tail = Tail {
        requests: requests.clone(),
        failing,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        Server::builder()
            .add_service(PaymentsServer::new(tail))
            .serve_with_incoming(incoming)
            .await
            .expect("serve");
    });
    (addr, requests)
}

const HEDGED: &str = r#"{
  "methodConfig": [{
    "name": [{"service": "payments.Payments", "method": "GetCharge"}],
    "timeout": "2s",
    "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.02s", "nonFatalStatusCodes": ["UNAVAILABLE"]}
  }],
  "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
}"#;

const PLAIN: &str = r#"{
  "methodConfig": [{"name": [{"service": "payments.Payments"}], "timeout": "2s"}]
}"#;

struct Run {
    latencies: Vec<Duration>,
    failures: usize,
    requests: u64,
}

async fn run(config: &str, failing: u64) -> Run {
    let (addr, requests) = serve(failing).await;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let layer = RetryLayer::grpc(Policy::new(Duration::from_secs(2)))
        .service_config(ServiceConfig::from_json(config).expect("a valid service config"));
    let client = PaymentsClient::new(layer.layer(channel));
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let mut client = client.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let (mut latencies, mut failures) = (Vec::new(), 0);
            while next.fetch_add(1, Ordering::SeqCst) < CALLS as u64 {
                let t0 = Instant::now();
                let request = GetChargeRequest {
                    idempotency_key: "read".into(),
                };
                if client.get_charge(request).await.is_err() {
                    failures += 1;
                }
                latencies.push(t0.elapsed());
            }
            (latencies, failures)
        }));
    }
    let mut out = Run {
        latencies: Vec::new(),
        failures: 0,
        requests: 0,
    };
    for t in tasks {
        let (l, f) = t.await.expect("task");
        out.latencies.extend(l);
        out.failures += f;
    }
    out.latencies.sort();
    out.requests = requests.load(Ordering::SeqCst);
    out
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    println!(
        "{:<34} {:>8} {:>8} {:>9} {:>13} {:>9}",
        "run", "p50 ms", "p99 ms", "p99.9 ms", "requests/call", "failures"
    );
    for (name, config, failing) in [
        ("without hedging", PLAIN, 0),
        ("with hedging", HEDGED, 0),
        ("with hedging, 1 in 3 unavailable", HEDGED, 3),
    ] {
        let r = run(config, failing).await;
        println!(
            "{:<34} {:>8.1} {:>8.1} {:>9.1} {:>13.3} {:>9}",
            name,
            pct(&r.latencies, 0.50),
            pct(&r.latencies, 0.99),
            pct(&r.latencies, 0.999),
            r.requests as f64 / CALLS as f64,
            r.failures
        );
    }
}
