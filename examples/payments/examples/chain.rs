//! Retries across services, with real processes: a client → A → (B →) a
//! store that is down, over gRPC (tonic) and over HTTP (axum, reqwest), each
//! hop a process of its own retrying its call to the next 3 times with
//! `#[retryable]`, as a user writes it.
//!
//! ```text
//! cargo run -p retries-payments --example chain
//! ```
//!
//! For each protocol and chain length it runs the chain twice: **naive**
//! (every hop owns its retries: `ServerLayer::advise_no_retry(false)`) and
//! **with the layers** (`retries_tower::ServerLayer` on every server, its
//! defaults and a 50 ms reserve), and prints the store calls per client
//! call, the calls that reached the store after the client's call had ended
//! (phantoms), and the deadline each hop's handler saw. It exits with an
//! error when a target is missed: ≤ 3 store calls per client call with the
//! layers, 0 phantoms, every hop's deadline ≤ its caller's less the reserve.
//!
//! Run as `chain serve <grpc|http> <store|hop> <on|off> [next]`, it is one
//! server process: it prints `listening <addr>`, then a line per event
//! (`store-call`, `deadline <ms|none>`), and exits when its stdin closes.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use retries::http::{HttpError, check};
use retries::retryable;
use retries::wire::{TIMEOUT_MS, timeout_value};

use retries_tower::ServerLayer;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

const RESERVE: Duration = Duration::from_millis(50);
const CALLS: u32 = 5;
/// The client's call, and each hop's: 3 attempts within 5 s.
const DEADLINE: Duration = Duration::from_secs(5);

fn layer(on: bool, grpc: bool) -> ServerLayer {
    let layer = if grpc {
        ServerLayer::grpc()
    } else {
        ServerLayer::http()
    };
    layer.reserve(RESERVE).advise_no_retry(on)
}

/// A hop's (and the client's) call over HTTP: three attempts, the time left
/// on the wire.
#[retryable(deadline = "5s", max_attempts = 3, idempotent, backoff = "constant", initial_backoff = "1ms",
            budget = "none", attempt = at)]
async fn forward(client: &reqwest::Client, url: &str) -> Result<String, HttpError> {
    let request = client
        .get(url)
        .header(TIMEOUT_MS, timeout_value(at.remaining()));
    Ok(check(request.send().await?)?.text().await?)
}

/// One server process: print the address, then events, until stdin closes.
async fn serve(grpc: bool, role: &str, on: bool, next: Option<SocketAddr>) {
    let layer = layer(on, grpc);
    let store = role == "store";
    let addr = if grpc {
        if store {
            let (addr, ledger) =
                retries_payments::serve_dead_store(layer, "127.0.0.1:0", Duration::ZERO).await;
            tokio::spawn(async move {
                let mut seen = 0;
                loop {
                    let now = ledger.charge_calls();
                    for _ in seen..now {
                        println!("store-call");
                    }
                    seen = now;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            });
            addr
        } else {
            let hop =
                retries_payments::serve_hop(next.expect("a hop has a next"), layer, "127.0.0.1:0")
                    .await;
            let handle = hop.clone();
            tokio::spawn(async move {
                let mut seen = 0;
                loop {
                    let deadlines = handle.deadlines();
                    for d in &deadlines[seen..] {
                        print_deadline(*d);
                    }
                    seen = deadlines.len();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            });
            hop.addr
        }
    } else {
        let app = if store {
            Router::new().route(
                "/",
                get(|| async {
                    println!("store-call");
                    StatusCode::SERVICE_UNAVAILABLE
                }),
            )
        } else {
            let client = reqwest::Client::new();
            let next = format!("http://{}/", next.expect("a hop has a next"));
            Router::new().route(
                "/",
                get(move || {
                    let (client, next) = (client.clone(), next.clone());
                    async move {
                        print_deadline(retries::scope::remaining());
                        match forward(&client, &next).await {
                            Ok(body) => (StatusCode::OK, body),
                            Err(_) => (StatusCode::SERVICE_UNAVAILABLE, String::new()),
                        }
                    }
                }),
            )
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("its address");
        tokio::spawn(async move {
            axum::serve(listener, app.layer(layer))
                .await
                .expect("serve");
        });
        addr
    };
    println!("listening {addr}");
    // Until the parent closes our stdin (or dies).
    let mut sink = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
}

fn print_deadline(d: Option<Duration>) {
    match d {
        Some(d) => println!("deadline {}", d.as_millis()),
        None => println!("deadline none"),
    }
}

/// A child server and what it reported.
struct Process {
    _child: Child,
    addr: SocketAddr,
    store_calls: Arc<AtomicU32>,
    deadlines: Arc<Mutex<Vec<Option<u64>>>>,
}

async fn spawn(grpc: bool, role: &str, on: bool, next: Option<SocketAddr>) -> Process {
    let mut command = Command::new(std::env::current_exe().expect("this program"));
    command
        .arg("serve")
        .arg(if grpc { "grpc" } else { "http" })
        .arg(role)
        .arg(if on { "on" } else { "off" });
    if let Some(next) = next {
        command.arg(next.to_string());
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("a child process");
    let mut lines = BufReader::new(child.stdout.take().expect("its stdout")).lines();
    let first = lines.next_line().await.ok().flatten().unwrap_or_default();
    let addr = first
        .strip_prefix("listening ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("a child said {first:?}"));
    let store_calls = Arc::new(AtomicU32::new(0));
    let deadlines = Arc::new(Mutex::new(Vec::new()));
    let (calls, seen) = (store_calls.clone(), deadlines.clone());
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if line == "store-call" {
                calls.fetch_add(1, Ordering::SeqCst);
            } else if let Some(d) = line.strip_prefix("deadline ") {
                seen.lock().await.push(d.parse().ok());
            }
        }
    });
    Process {
        _child: child,
        addr,
        store_calls,
        deadlines,
    }
}

/// One scenario's figures.
struct Figures {
    per_call: f64,
    phantoms: u32,
    /// The largest deadline each hop saw, in ms (`None`: none travelled).
    seen: Vec<Option<u64>>,
    deadlines_ok: bool,
}

async fn scenario(grpc: bool, hops: usize, on: bool) -> Figures {
    let store = spawn(grpc, "store", on, None).await;
    let mut chain = vec![store];
    // The hops that retry besides the client: 1 (A) or 2 (B, then A).
    for _ in 1..hops {
        let next = chain.last().expect("the store").addr;
        chain.push(spawn(grpc, "hop", on, Some(next)).await);
    }
    let first = chain.last().expect("a hop").addr;
    let http = reqwest::Client::new();
    let grpc_client = retries_payments::Client::new(first);
    let mut phantoms = 0;
    for _ in 0..CALLS {
        let result = if grpc {
            grpc_client
                .forward(1)
                .await
                .map(|_| ())
                .map_err(|s| s.to_string())
        } else {
            forward(&http, &format!("http://{first}/"))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(result.is_err(), "the store is down");
        tokio::time::sleep(Duration::from_millis(50)).await; // the last lines in
        let at_end = chain[0].store_calls.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(250)).await;
        phantoms += chain[0].store_calls.load(Ordering::SeqCst) - at_end;
    }
    let per_call = f64::from(chain[0].store_calls.load(Ordering::SeqCst)) / f64::from(CALLS);
    // Outermost hop first: its caller is the client (5 s); each next one's
    // caller is the hop before it.
    let mut seen = Vec::new();
    let mut deadlines_ok = true;
    let mut caller_max = Some(DEADLINE.as_millis() as u64);
    for hop in chain[1..].iter().rev() {
        let all = hop.deadlines.lock().await.clone();
        let max = all.iter().flatten().max().copied();
        if let (Some(max), Some(caller)) = (max, caller_max) {
            deadlines_ok &= max + RESERVE.as_millis() as u64 <= caller;
        } else {
            deadlines_ok = false;
        }
        seen.push(max);
        caller_max = max;
    }
    Figures {
        per_call,
        phantoms,
        seen,
        deadlines_ok,
    }
}

async fn run() -> bool {
    println!(
        "{CALLS} client calls per row; every hop (and the client) allows 3 attempts within 5 s; the store is down"
    );
    println!();
    println!(
        "| protocol | hops retrying | mode | store calls per client call | phantom calls | deadline each hop saw (ms, outermost first) | ≤ caller's − reserve |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut ok = true;
    for grpc in [true, false] {
        for hops in [2, 3] {
            for on in [false, true] {
                let f = scenario(grpc, hops, on).await;
                let seen: Vec<String> = f
                    .seen
                    .iter()
                    .map(|d| d.map_or_else(|| "none".into(), |d| d.to_string()))
                    .collect();
                println!(
                    "| {} | {hops} (client{}) | {} | {} | {} | {} | {} |",
                    if grpc { "gRPC" } else { "HTTP" },
                    if hops == 3 { ", A, B" } else { ", A" },
                    if on { "with the layers" } else { "naive" },
                    f.per_call,
                    f.phantoms,
                    seen.join(" / "),
                    if f.deadlines_ok { "yes" } else { "NO" }
                );
                let naive = if hops == 3 { 27.0 } else { 9.0 };
                ok &= f.phantoms == 0 && f.deadlines_ok;
                ok &= if on {
                    f.per_call <= 3.0
                } else {
                    (f.per_call - naive).abs() < f64::EPSILON
                };
            }
        }
    }
    println!();
    println!("{}", if ok { "targets met" } else { "TARGETS MISSED" });
    ok
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("serve") {
        let grpc = args.get(1).map(String::as_str) == Some("grpc");
        let role = args.get(2).cloned().unwrap_or_default();
        let on = args.get(3).map(String::as_str) == Some("on");
        let next = args.get(4).and_then(|a| a.parse().ok());
        serve(grpc, &role, on, next).await;
        return;
    }
    if !run().await {
        std::process::exit(1);
    }
}
