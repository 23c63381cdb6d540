//! `cargo run -p retries-payments --example chaos`: every fault kind of
//! `retries::chaos` at 20 % on the charge path of a payments service that
//! does not deduplicate, over gRPC and over HTTP, against a hand-written
//! retry loop and against `retries` with `reconcile`; prints calls, effects
//! (charges) and duplicate effects per caller. Pass a number of calls per
//! row (default 100).

use retries_chaos::FaultKind;
use retries_payments::chaos::{Caller, Tally, grpc, http};

const ATTEMPTS: u32 = 4;
const SEED: u64 = 2026;

fn row(t: &Tally) {
    let r = &t.report;
    let faults: Vec<String> = FaultKind::ALL
        .iter()
        .map(|&k| format!("{} {}/{}", k, r.injected(k), r.observed(k)))
        .collect();
    println!(
        "{:<5} {:<20} {:>5} {:>5} {:>8} {:>8} {:>10}   {}",
        t.protocol,
        t.caller.name(),
        t.calls,
        t.ok,
        r.requests,
        r.effects,
        r.duplicate_effects,
        faults.join(", ")
    );
}

#[tokio::main]
async fn main() {
    let calls = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(100);
    println!(
        "every fault kind at 20 % on the charges, {ATTEMPTS} attempts per call, seed {SEED}\n"
    );
    println!(
        "{:<5} {:<20} {:>5} {:>5} {:>8} {:>8} {:>10}   faults injected/observed",
        "proto", "caller", "calls", "ok", "requests", "effects", "duplicates"
    );
    for caller in [Caller::Naive, Caller::Retries] {
        row(&grpc(caller, calls, ATTEMPTS, SEED).await);
    }
    for caller in [Caller::Naive, Caller::Retries] {
        row(&http(caller, calls, ATTEMPTS, SEED).await);
    }
}
