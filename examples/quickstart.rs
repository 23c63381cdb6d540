//! `cargo run --example quickstart`: a retry loop at work, with its attempt log.
//!
//! 1. An inventory service refuses the first two connections (nothing was
//!    sent, so the outcome is *not executed*) and answers the third: the call
//!    is retried and succeeds.
//! 2. A payment service charges the card, then the connection breaks before the
//!    reply (outcome *unknown*). Charging is not idempotent, so the call is not
//!    blindly repeated: `reconcile` looks the charge up by the call's
//!    idempotency key, finds it, and the call succeeds with one charge.
//!
//! The attempt log comes from the library's `tracing` events (one per attempt,
//! one per call), printed by a `tracing-subscriber` formatter.

use std::collections::HashMap;
use std::io::{self, IsTerminal};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use retries::{IdempotencyKey, retryable};
use tokio::time::Instant;

/// An in-process stand-in for a flaky inventory service.
struct Inventory {
    refusals_left: AtomicU32,
}

impl Inventory {
    async fn connect_and_query(&self, sku: &str) -> io::Result<u32> {
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

    /// Reading stock is safe to repeat. `io::Error` classifies itself:
    /// `ConnectionRefused` means nothing was sent (not executed).
    #[retryable(deadline = "2s", max_attempts = 3, idempotent)]
    async fn stock(&self, sku: &str) -> io::Result<u32> {
        self.connect_and_query(sku).await
    }
}

/// A payment service that loses its reply after charging, once.
#[derive(Default)]
struct Payments {
    charges: Mutex<HashMap<IdempotencyKey, u64>>,
    lose_reply: AtomicU32,
}

impl Payments {
    async fn send_charge(&self, key: IdempotencyKey, cents: u64) -> io::Result<String> {
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

    async fn find_charge(&self, key: IdempotencyKey) -> io::Result<Option<String>> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let found = self.charges.lock().unwrap().contains_key(&key);
        tracing::info!(%key, found, "reconcile: looked the charge up");
        Ok(found.then(|| format!("receipt-{key}")))
    }

    /// Charging is not safe to repeat blindly: an unknown outcome is resolved
    /// by looking the charge up with the same idempotency key.
    #[retryable(
        deadline = "2s",
        max_attempts = 3,
        idempotent = false,
        reconcile = |key| self.find_charge(key),
        attempt = at
    )]
    async fn charge(&self, cents: u64) -> io::Result<String> {
        tracing::info!(key = %at.idempotency_key(), "charging");
        self.send_charge(at.idempotency_key(), cents).await
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // The attempt log: `retries` reports retries at DEBUG (and a call that
    // gives up at WARN); everything else at INFO. The `otel.*` fields are
    // for OpenTelemetry exporters (both the call's span and the attempt's
    // carry `otel.name`): this log leaves them out, so each field shows once
    // a line.
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .without_time()
                .with_ansi(std::io::stdout().is_terminal())
                .with_target(false)
                .fmt_fields(WithoutOtel)
                .compact(),
        )
        .with(
            Targets::new()
                .with_default(tracing::Level::INFO)
                .with_target("retries", tracing::Level::DEBUG),
        )
        .init();

    println!("1. inventory lookup (idempotent), refused twice:");
    let inventory = Inventory {
        refusals_left: AtomicU32::new(2),
    };
    let t0 = Instant::now();
    let stock = inventory.stock("sku-1234").await;
    println!("   result: {stock:?} in {:.1?}\n", t0.elapsed());

    println!("2. charge (not idempotent), reply lost after the charge:");
    let payments = Payments {
        lose_reply: AtomicU32::new(1),
        ..Payments::default()
    };
    let t0 = Instant::now();
    let receipt = payments.charge(1999).await;
    println!("   result: {receipt:?} in {:.1?}", t0.elapsed());
    println!(
        "   charges made: {}",
        payments.charges.lock().unwrap().len()
    );
}

/// The log's field formatter: every field as `name=value` (the message as
/// it is), but not the `otel.*` fields, which are for OpenTelemetry
/// exporters and would repeat what `function` says.
struct WithoutOtel;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for WithoutOtel {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut visitor = Fields {
            writer: &mut writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct Fields<'a, 'w> {
    writer: &'a mut tracing_subscriber::fmt::format::Writer<'w>,
    first: bool,
    result: std::fmt::Result,
}

impl tracing::field::Visit for Fields<'_, '_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if self.result.is_err() || field.name().starts_with("otel.") {
            return;
        }
        let gap = if std::mem::take(&mut self.first) {
            ""
        } else {
            " "
        };
        self.result = if field.name() == "message" {
            write!(self.writer, "{gap}{value:?}")
        } else {
            write!(self.writer, "{gap}{}={value:?}", field.name())
        };
    }
}
