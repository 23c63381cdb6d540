//! Fault injection by verdict, for running systems: the
//! faults a retry policy must survive, injected where they happen, including
//! the one behind double charges that outcome-replacing fault injectors cannot
//! make: **the work happened, then the reply was lost**.
//!
//! A [`Chaos`] holds the rules (a [`Fault`], a rate, a scope), a seeded
//! random source, a runtime switch and the counters. It is shared (cheap to
//! clone, `Send + Sync`) by the places that inject:
//!
//! | place | how | kinds |
//! |---|---|---|
//! | a server (axum, hyper, tonic) | [`FaultLayer`] (feature `tower`) | all five |
//! | a tower client (hyper, a tonic channel) | [`ClientFaultLayer`] (feature `tower`), under the retry layer | all five, on the client's side of the wire |
//! | an HTTP client (reqwest) | [`FaultMiddleware`] (feature `reqwest-middleware`), under the retry middleware | the same |
//! | code no network layer sees | [`Chaos::around`] inside a `#[retryable]` body or a `retries::call` closure | all five, around the future |
//!
//! # The faults, by verdict
//!
//! | [`Fault`] | when | server answer | the client sees | verdict |
//! |---|---|---|---|---|
//! | `Refuse` | before the handler | HTTP 503 with `Retry-After` (the pause given, else 0: a 503 without it reads as an unknown outcome to a client, which would not resend a `POST`); gRPC `UNAVAILABLE` (with `grpc-retry-pushback-ms` if given) | a refusal; a refused connection from the middleware | not executed |
//! | `Delay` | before the handler | the handler's, late | a slow answer | — |
//! | `Hang` | before the handler | none until the caller's deadline (`grpc-timeout`, `retries-timeout-ms`) or `max`, then HTTP 504 / gRPC `DEADLINE_EXCEEDED` | a timeout | unknown |
//! | `DropReply` | **after** the handler | none: the connection is closed (HTTP/1.1: not a byte of the answer is sent) or the stream reset (HTTP/2, gRPC) | a broken connection | unknown |
//! | `FailAfter` | **after** the handler | its error status (default HTTP 503, gRPC `UNAVAILABLE`) | an error that came after the work | unknown |
//!
//! **With `IdempotencyLayer`** (`retries_tower::dedup`): put [`FaultLayer`]
//! outside it, so that a reply is lost after the key's record, as the
//! network loses one, and the client's retry is answered from the record.
//! Inside it, the faults before the handler compose (a refusal releases the
//! key) but the two after it would read to the idempotency layer as a
//! handler that failed or refused; they are not injected on a request that
//! carries its claim, and one WARN says so.
//!
//! Over plain HTTP/2 the head of a dropped reply is sent before the stream
//! is reset (hyper sends a response's head before its body, and an axum
//! service cannot fail): the client sees the status, then the body breaks.
//! Over HTTP/1.1 nothing of the answer is sent; over gRPC the reset comes
//! before any message, and a tonic client reports it as `INTERNAL`.
//!
//! # The demo
//!
//! `cargo run -p retries-payments --example chaos`: every kind at 20 % on
//! the charges of a payments service that does not deduplicate, 100 calls
//! of 4 attempts each, seed 2026, over gRPC (tonic) and HTTP (axum); the
//! same seed draws the same faults for the same request numbers on both, and
//! both callers meet them alike, so both protocols print the same figures:
//!
//! | caller | calls ok | requests | charges | charged twice | faults injected (delay, hang, refuse, drop, fail after) |
//! |---|---|---|---|---|---|
//! | a hand-written loop, every error retried with the same request | 84 | 202 | 130 | 31 | 43, 42, 30, 22, 24 |
//! | `retries`, not idempotent, `reconcile` by key | 90 | 208 (look-ups included) | 90 | 0 | 28, 25, 18, 13, 19 |
//!
//! Every charge of the second caller is a call that succeeded; its 10
//! failed calls charged nothing.
//!
//! # Rates, scopes, the switch
//!
//! Each [`Rule`] draws on its own for each request (an independent rate
//! per rule): several faults may meet in one request, in the order of the
//! table (a delay, then a hang or a refusal, and after the handler a dropped
//! reply before an error status). A draw depends only on the seed, the
//! request's number (every request is numbered as it arrives, from 0, with
//! the switch on or off) and the rule's index: a sequential run is
//! reproducible from its seed, and request 150 draws the same whether the
//! switch was off for the first 100 or not.
//!
//! A rule's scope is a list of patterns, `"METHOD /prefix"` or `"/prefix"`
//! (an HTTP request's method and path, a gRPC call's method path such as
//! `/payments.Payments/Charge`, or the name given to [`Chaos::around`]);
//! no pattern means every request. The switch ([`Chaos::set_enabled`]) and
//! the rates ([`Chaos::set_rate`]) change while running, from any task or
//! thread, and take effect on the next request; a disabled `Chaos` costs two
//! atomic operations per request (the request counter and the switch), and
//! a service without the layer nothing at all. A `Chaos` starts enabled (as
//! Polly's chaos strategies do), or disabled with
//! [`ChaosBuilder::start_disabled`], for an operator to turn on.
//!
//! # Counting what happened
//!
//! For each kind, **injected** counts the faults drawn and applied, and
//! **observed** those that took effect: a dropped reply whose connection
//! was really cut (not one whose handler failed by itself, or whose caller
//! left first), a delay that ran out, a hang that ended (by its caller
//! leaving or its bound). The server's handler reports each effect it
//! performs with [`Chaos::effect`] and the key that identifies it (a
//! charge's idempotency key, an order's external id); [`Chaos::report`]
//! gives requests, effects and **duplicate effects**: the figure that shows
//! whether idempotency keys and `reconcile` hold. The same counts go to the
//! `metrics` facade (`retry.chaos.injected`, `retry.chaos.observed`, label
//! `kind`) and to DEBUG events (target `retries::chaos`).
//!
//! ```
//! use std::time::Duration;
//! use retries_chaos::{Chaos, Fault, Rule};
//!
//! let chaos = Chaos::builder()
//!     .seed(7)
//!     .rule(Rule::new(Fault::DropReply).rate(0.2).only(["POST /charges"]))
//!     .rule(Rule::new(Fault::Refuse { retry_after: Some(Duration::from_secs(1)) }).rate(0.1))
//!     .build()?;
//! // From an admin endpoint, while running:
//! chaos.set_rate(retries_chaos::FaultKind::DropReply, 0.05)?;
//! chaos.set_enabled(false);
//! # Ok::<(), retries_chaos::ChaosError>(())
//! ```
#![cfg_attr(feature = "tower", doc = "[`FaultLayer`]: crate::FaultLayer")]
#![cfg_attr(
    not(feature = "tower"),
    doc = "[`FaultLayer`]: https://docs.rs/retries-core/latest/retries_core/chaos/struct.FaultLayer.html"
)]
#![cfg_attr(
    feature = "tower",
    doc = "[`ClientFaultLayer`]: crate::ClientFaultLayer"
)]
#![cfg_attr(
    not(feature = "tower"),
    doc = "[`ClientFaultLayer`]: https://docs.rs/retries-core/latest/retries_core/chaos/struct.ClientFaultLayer.html"
)]
#![cfg_attr(
    feature = "reqwest-middleware",
    doc = "[`FaultMiddleware`]: crate::FaultMiddleware"
)]
#![cfg_attr(
    not(feature = "reqwest-middleware"),
    doc = "[`FaultMiddleware`]: https://docs.rs/retries-core/latest/retries_core/chaos/struct.FaultMiddleware.html"
)]

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use retries_core::verdict::{Classify, Verdict};

#[cfg(feature = "tower")]
mod client;
#[cfg(feature = "reqwest-middleware")]
mod middleware;
#[cfg(feature = "tower")]
mod server;

mod fault;
mod rules;
mod switch;

pub use fault::{ChaosError, Fault, FaultKind, Injected};
pub use rules::{ChaosBuilder, Rule};
pub use switch::{Chaos, Report};
#[allow(clippy::wildcard_imports)]
use {rules::*, switch::*};

#[cfg(feature = "tower")]
pub use client::{ClientFaultFuture, ClientFaultLayer, ClientFaultService};
#[cfg(feature = "reqwest-middleware")]
pub use middleware::FaultMiddleware;
#[cfg(feature = "tower")]
pub use server::{FaultBody, FaultFuture, FaultLayer, FaultService};

#[cfg(test)]
mod tests {
    use super::*;

    fn chaos(rules: Vec<Rule>) -> Chaos {
        rules
            .into_iter()
            .fold(Chaos::builder().seed(42), ChaosBuilder::rule)
            .build()
            .unwrap()
    }

    #[test]
    fn rates_hold_over_ten_thousand_draws_and_repeat_with_the_seed() {
        let make = || {
            chaos(vec![
                Rule::new(Fault::DropReply).rate(0.2),
                Rule::new(Fault::Refuse { retry_after: None }).rate(0.05),
            ])
        };
        let (a, b) = (make(), make());
        let mut seq_a = Vec::new();
        for _ in 0..10_000 {
            let p = a.plan(Some("POST"), "/x");
            seq_a.push((p.after.is_some(), p.refuse.is_some()));
            let q = b.plan(Some("POST"), "/x");
            assert_eq!(
                (q.after.is_some(), q.refuse.is_some()),
                *seq_a.last().unwrap()
            );
        }
        let r = a.report();
        // A refusal takes the dropped reply's place: 0.2 * 0.95 = 0.19.
        let drop = r.injected(FaultKind::DropReply);
        let refuse = r.injected(FaultKind::Refuse);
        assert!((1_800..=2_000).contains(&drop), "{drop}");
        assert!((420..=580).contains(&refuse), "{refuse}");
        assert_eq!(r.requests, 10_000);
    }

    #[test]
    fn scopes_switch_and_rates() {
        let c = chaos(vec![
            Rule::new(Fault::DropReply).only(["POST /charges", "/pay.P/"]),
        ]);
        assert!(c.plan(Some("POST"), "/charges/1").after.is_some());
        assert!(c.plan(Some("GET"), "/charges/1").after.is_none());
        assert!(c.plan(Some("POST"), "/pay.P/Charge").after.is_some());
        assert!(c.plan(None, "charge").after.is_none());
        c.set_enabled(false);
        assert!(c.plan(Some("POST"), "/charges/1").is_empty());
        c.set_enabled(true);
        c.set_rate(FaultKind::DropReply, 0.0).unwrap();
        assert!(c.plan(Some("POST"), "/charges/1").is_empty());
        assert_eq!(
            c.set_rate(FaultKind::Hang, 0.5),
            Err(ChaosError::NoRule(FaultKind::Hang))
        );
        assert!(matches!(
            c.set_rate(FaultKind::DropReply, f64::NAN),
            Err(ChaosError::Rate { .. })
        ));
    }

    #[test]
    fn bad_settings_are_errors() {
        for rate in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
            let e = Chaos::builder()
                .rule(Rule::new(Fault::DropReply).rate(rate))
                .build()
                .unwrap_err();
            assert!(matches!(e, ChaosError::Rate { rule: 0, .. }), "{e}");
        }
        for p in ["", "POST", "POST  /x", "PO5T /x", "a b c"] {
            let built = Chaos::builder()
                .rule(Rule::new(Fault::DropReply))
                .rule(Rule::new(Fault::DropReply).only([p]))
                .build();
            if p == "POST" {
                // A bare word is a prefix (a name for `around`).
                assert!(built.is_ok());
                continue;
            }
            assert!(
                matches!(built, Err(ChaosError::Pattern { rule: 1, .. })),
                "{p:?}"
            );
        }
    }

    #[test]
    fn a_fail_after_status_out_of_range_is_an_error() {
        for (http_status, grpc_code) in [(99, 14), (600, 14), (503, 0), (503, 17)] {
            let e = Chaos::builder()
                .rule(Rule::new(Fault::FailAfter {
                    http_status,
                    grpc_code,
                }))
                .build()
                .unwrap_err();
            assert!(matches!(e, ChaosError::Status { rule: 0, .. }), "{e}");
        }
    }

    #[test]
    fn effects_count_duplicates() {
        let c = chaos(vec![]);
        c.effect("k1");
        c.effect("k2");
        c.effect("k1");
        let r = c.report();
        assert_eq!((r.effects, r.duplicate_effects), (3, 1));
    }
}
