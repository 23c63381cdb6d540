//! SPEC §13's reference table, reproduced in-process with `#[retryable]`
//! against a fake payments service that counts how many times `charge` really
//! charged. (The same rows run against a real gRPC server in the tonic
//! integration.) Every row: `max_attempts = 3`, one client call.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use retries::{Classify, IdempotencyKey, Verdict, retryable};
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Code {
    Unavailable,
    Internal,
    DeadlineExceeded,
}

#[derive(Debug, thiserror::Error)]
enum PayError {
    #[error("{0:?}")]
    Status(Code),
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

impl PayError {
    fn code(&self) -> Code {
        match self {
            PayError::Status(c) => *c,
            PayError::Stopped(s) if s.reason() == retries::Reason::DeadlineExceeded => {
                Code::DeadlineExceeded
            }
            PayError::Stopped(s) => panic!("unexpected stop {s}"),
        }
    }
}

/// The gRPC status-code guidance: UNAVAILABLE may have run; INTERNAL is the
/// handler failing, which retrying does not fix.
impl Classify for PayError {
    fn classify(&self) -> Verdict {
        match self {
            PayError::Status(Code::Unavailable) => Verdict::unknown(),
            _ => Verdict::permanent(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    UnavailableBefore,
    InternalAfter,
    UnavailableAfter,
    SleepThenUnavailable(Duration),
}

#[derive(Default)]
struct Payments {
    faults: Mutex<VecDeque<Fault>>,
    charges: Mutex<HashMap<IdempotencyKey, u64>>,
    attempts: AtomicU32,
}

impl Payments {
    fn with(faults: &[Fault]) -> Self {
        Self {
            faults: Mutex::new(faults.iter().copied().collect()),
            ..Self::default()
        }
    }

    /// The server's handler.
    async fn charge(&self, key: IdempotencyKey, cents: u64) -> Result<u64, PayError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(2)).await;
        let fault = self.faults.lock().unwrap().pop_front();
        match fault {
            Some(Fault::UnavailableBefore) => return Err(PayError::Status(Code::Unavailable)),
            Some(Fault::SleepThenUnavailable(d)) => {
                tokio::time::sleep(d).await;
                return Err(PayError::Status(Code::Unavailable));
            }
            _ => {}
        }
        self.charges.lock().unwrap().insert(key, cents);
        match fault {
            Some(Fault::InternalAfter) => Err(PayError::Status(Code::Internal)),
            Some(Fault::UnavailableAfter) => Err(PayError::Status(Code::Unavailable)),
            _ => Ok(cents),
        }
    }

    async fn get_charge(&self, key: IdempotencyKey) -> Result<Option<u64>, PayError> {
        tokio::time::sleep(Duration::from_millis(1)).await;
        Ok(self.charges.lock().unwrap().get(&key).copied())
    }

    fn charged(&self) -> usize {
        self.charges.lock().unwrap().len()
    }

    fn attempts(&self) -> u32 {
        self.attempts.load(Ordering::SeqCst)
    }
}

struct Client<'a> {
    server: &'a Payments,
}

impl Client<'_> {
    /// The recommended client: not idempotent, reconciled by key.
    #[retryable(
        deadline = "2s",
        max_attempts = 3,
        idempotent = false,
        reconcile = |key| self.server.get_charge(key),
        attempt = at,
        backoff = "constant",
        initial_backoff = "100ms"
    )]
    async fn charge(&self, cents: u64) -> Result<u64, PayError> {
        self.server.charge(at.idempotency_key(), cents).await
    }

    /// The same, but the user decided INTERNAL is transient.
    #[retryable(
        deadline = "2s",
        max_attempts = 3,
        idempotent = false,
        reconcile = |key| self.server.get_charge(key),
        classify = |e: &PayError| match e {
            PayError::Status(Code::Internal | Code::Unavailable) => Verdict::unknown(),
            _ => Verdict::permanent(),
        },
        attempt = at,
        backoff = "constant",
        initial_backoff = "100ms"
    )]
    async fn charge_internal_transient(&self, cents: u64) -> Result<u64, PayError> {
        self.server.charge(at.idempotency_key(), cents).await
    }

    /// Not idempotent, and nothing to reconcile with.
    #[retryable(deadline = "2s", max_attempts = 3, idempotent = false, attempt = at)]
    async fn charge_unreconciled(&self, cents: u64) -> Result<u64, PayError> {
        self.server.charge(at.idempotency_key(), cents).await
    }

    /// An idempotent read-like call for the deadline row.
    #[retryable(
        deadline = "2s",
        max_attempts = 3,
        idempotent,
        attempt = at,
        backoff = "constant",
        initial_backoff = "100ms"
    )]
    async fn charge_idempotent(&self, cents: u64) -> Result<u64, PayError> {
        self.server.charge(at.idempotency_key(), cents).await
    }
}

#[tokio::test(start_paused = true)]
async fn row1_unavailable_before_the_handler_then_ok() {
    let server = Payments::with(&[Fault::UnavailableBefore]);
    let r = Client { server: &server }.charge(1999).await;
    assert_eq!(r.unwrap(), 1999);
    assert_eq!((server.attempts(), server.charged()), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn row2_internal_after_the_charge_default_classification() {
    let server = Payments::with(&[Fault::InternalAfter]);
    let r = Client { server: &server }.charge(1999).await;
    assert_eq!(r.unwrap_err().code(), Code::Internal);
    assert_eq!((server.attempts(), server.charged()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn row3_internal_after_the_charge_marked_transient() {
    let server = Payments::with(&[Fault::InternalAfter]);
    let r = Client { server: &server }
        .charge_internal_transient(1999)
        .await;
    assert_eq!(r.unwrap(), 1999, "reconcile finds the charge");
    assert_eq!((server.attempts(), server.charged()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn row4_unavailable_after_the_charge() {
    let server = Payments::with(&[Fault::UnavailableAfter]);
    let r = Client { server: &server }.charge(1999).await;
    assert_eq!(r.unwrap(), 1999, "reconcile finds the charge");
    assert_eq!((server.attempts(), server.charged()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn row5_unavailable_after_the_charge_without_reconcile() {
    let server = Payments::with(&[Fault::UnavailableAfter]);
    let r = Client { server: &server }.charge_unreconciled(1999).await;
    assert_eq!(r.unwrap_err().code(), Code::Unavailable);
    assert_eq!((server.attempts(), server.charged()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn row6_slow_unavailable_hits_the_deadline_after_two_attempts() {
    let slow = Fault::SleepThenUnavailable(Duration::from_millis(1498));
    let server = Payments::with(&[slow, slow, slow]);
    let t0 = Instant::now();
    let r = Client { server: &server }.charge_idempotent(1999).await;
    assert_eq!(r.unwrap_err().code(), Code::DeadlineExceeded);
    assert_eq!(t0.elapsed(), Duration::from_secs(2));
    assert_eq!((server.attempts(), server.charged()), (2, 0));
}
