//! `cargo run --example quickstart`: a retry loop at work, with its attempt log.
//!
//! 1. An inventory service refuses the first two connections (nothing was
//!    sent, so the outcome is *not executed*) and answers the third: the call
//!    is retried and succeeds.
//! 2. A payment service charges the card, then the connection breaks before the
//!    reply (outcome *unknown*). Charging is not idempotent, so the call is not
//!    blindly repeated: `reconcile` looks the charge up by the call's
//!    idempotency key, finds it, and the call succeeds with one charge.

use std::collections::HashMap;
use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use retry::{Attempt, IdempotencyKey, Policy, RetryEvent};
use tokio::time::Instant;

const POLICY: Policy = Policy::new(Duration::from_secs(2))
    .with_max_attempts(3)
    .validated();

/// An in-process stand-in for a flaky inventory service.
struct Inventory {
    refusals_left: AtomicU32,
}

impl Inventory {
    async fn stock(&self, sku: &str) -> io::Result<u32> {
        tokio::time::sleep(Duration::from_millis(5)).await; // network round trip
        if self
            .refusals_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "connection refused",
            ));
        }
        Ok(sku.len() as u32 * 7)
    }
}

/// A payment service that loses its reply after charging, once.
#[derive(Default)]
struct Payments {
    charges: Mutex<HashMap<IdempotencyKey, u64>>,
    lose_reply: AtomicU32,
}

impl Payments {
    async fn charge(&self, key: IdempotencyKey, cents: u64) -> io::Result<String> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.charges.lock().unwrap().entry(key).or_insert(cents);
        if self.lose_reply.swap(0, Ordering::SeqCst) == 1 {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "connection reset after sending",
            ));
        }
        Ok(format!("receipt-{key}"))
    }

    async fn find(&self, key: IdempotencyKey) -> io::Result<Option<String>> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(self
            .charges
            .lock()
            .unwrap()
            .contains_key(&key)
            .then(|| format!("receipt-{key}")))
    }
}

fn log_retry(e: &RetryEvent<'_, io::Error>) {
    let error = e
        .error()
        .map_or_else(|| "cut off".to_string(), ToString::to_string);
    println!(
        "  attempt {} failed: {error} [{}] → pause {:.1?}",
        e.attempt(),
        e.verdict(),
        e.delay()
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    println!("policy: {POLICY}\n");

    println!("1. inventory lookup (idempotent), refused twice:");
    let inventory = Inventory {
        refusals_left: AtomicU32::new(2),
    };
    let t0 = Instant::now();
    let stock = retry::call(&POLICY)
        .idempotent()
        .on_retry(log_retry)
        .run(async |at: &Attempt| {
            let r = inventory.stock("sku-1234").await;
            if let Ok(n) = &r {
                println!("  attempt {} succeeded: {n} in stock", at.number());
            }
            r
        })
        .await;
    println!("  result: {stock:?} in {:.1?}\n", t0.elapsed());

    println!("2. charge (not idempotent), reply lost after the charge:");
    let payments = Payments {
        lose_reply: AtomicU32::new(1),
        ..Payments::default()
    };
    let t0 = Instant::now();
    let receipt = retry::call(&POLICY)
        .not_idempotent()
        .reconcile(|key| {
            println!("  outcome unknown: looking up charge {key}");
            payments.find(key)
        })
        .on_retry(log_retry)
        .run(async |at: &Attempt| {
            println!(
                "  attempt {} charging with key {}",
                at.number(),
                at.idempotency_key()
            );
            payments.charge(at.idempotency_key(), 1999).await
        })
        .await;
    println!("  result: {receipt:?} in {:.1?}", t0.elapsed());
    println!("  charges made: {}", payments.charges.lock().unwrap().len());
}
