//! `cargo run -p retries-payments --example grpc_overload`: a gRPC service of 100
//! calls a second on loopback under 1,000 calls a second from 200 callers,
//! with and without an `Admission` (K = 2) in the callers; real time, 12 s
//! per run. The paused-clock twin is the facade's `cargo run --example
//! overload`; the setup is in `retries_payments::overload`.

use retries_payments::overload::{Figures, Plan, run};

fn row(name: &str, f: &Figures) {
    println!(
        "{name:<24} {:>7.0} {:>7.0} {:>7.0} {:>8.2}x {:>8.2}x {:>8.1}% {:>7.0} {:>6} s",
        f.calls_per_sec,
        f.received_per_sec,
        f.accepted_per_sec,
        f.per_accepted(),
        f.per_capacity(),
        100.0 * f.success,
        f.throttled_per_sec,
        f.throttled_after,
    );
}

fn main() {
    let plan = Plan::SHORT;
    println!(
        "gRPC on loopback: a service of 100 calls/s under 1,000 calls/s for {:?} (seconds {} to {} measured), then 50 calls/s for {:?}; admission window {:?}",
        plan.overload,
        plan.steady_from.as_secs(),
        plan.overload.as_secs(),
        plan.calm,
        plan.window
    );
    println!(
        "{:<24} {:>7} {:>7} {:>7} {:>9} {:>9} {:>9} {:>7} {:>8}",
        "callers",
        "calls/s",
        "recv/s",
        "acc/s",
        "per acc",
        "per cap",
        "success",
        "local/s",
        "after"
    );
    row("token bucket", &run(false, &plan));
    row("admission K=2 + bucket", &run(true, &plan));
    println!(
        "(\"per acc\": requests the service received per call it accepted; \"local/s\": calls refused locally, nothing sent; \"after\": seconds after the overload with a call still refused locally)"
    );
}
