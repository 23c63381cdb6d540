//! `cargo run --example payments`: the reference table of the specification,
//! measured against a real gRPC payments server (tonic, on loopback) that
//! counts how many times `Charge` really charged.
//!
//! Each row starts a fresh server with a fault to inject, makes one client
//! call with `max_attempts = 3`, and reports what the caller got, how many
//! attempts the client made, how many times the card was charged, and how long
//! it took. The server does not deduplicate by idempotency key, so a blind
//! retry of a charge that happened would charge twice.
//!
//! Then the same service under every fault of `retries::chaos` at 20 %
//! (`retries_payments::chaos`): a hand-written loop against `retries` with
//! `reconcile`, 100 calls each, with the charges made twice (the `chaos`
//! example adds the HTTP side).

use retries_payments::chaos::{Caller, grpc};
use retries_payments::{SCENARIOS, run_row};

#[tokio::main]
async fn main() {
    println!(
        "{:<66} {:<44} {:>8} {:>8} {:>9}",
        "scenario", "result", "attempts", "charges", "elapsed"
    );
    let mut worst = 0;
    for i in 0..SCENARIOS.len() {
        let row = run_row(i).await;
        worst = worst.max(row.charges);
        println!(
            "{:<66} {:<44} {:>8} {:>8} {:>8.2}s",
            row.scenario,
            row.result,
            row.attempts,
            row.charges,
            row.elapsed.as_secs_f64()
        );
    }
    println!("\nmost charges in any row: {worst}");

    println!("\nevery fault kind at 20 % on Charge, 100 calls of 4 attempts, seed 2026:");
    println!(
        "{:<20} {:>8} {:>8} {:>14}",
        "caller", "calls ok", "charges", "charged twice"
    );
    for caller in [Caller::Naive, Caller::Retries] {
        let t = grpc(caller, 100, 4, 2026).await;
        println!(
            "{:<20} {:>8} {:>8} {:>14}",
            caller.name(),
            t.ok,
            t.report.effects,
            t.report.duplicate_effects
        );
    }
}
