//! `Chaos::around` in code no network layer sees, inside `#[retryable]`, on
//! the paused clock: a ledger write that loses its answer half the time,
//! under a caller that declares the write not idempotent and reconciles by
//! its key — every call succeeds and nothing is written twice; the same
//! faults under a caller that retries blindly write twice.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use retries::{Classify, IdempotencyKey, retryable};
use retries_chaos::{Chaos, Fault, FaultKind, Injected, Rule};

#[derive(Debug, thiserror::Error, Classify)]
enum Error {
    #[error(transparent)]
    #[classify(transparent)]
    Chaos(#[from] Injected),
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

struct Ledger {
    chaos: Chaos,
    rows: Mutex<HashMap<String, u32>>,
}

impl Ledger {
    fn new(rate: f64) -> Self {
        let chaos = Chaos::builder()
            .seed(11)
            .rule(
                Rule::new(Fault::DropReply)
                    .rate(rate)
                    .only(["ledger.write"]),
            )
            .rule(Rule::new(Fault::Delay(Duration::from_millis(5))).rate(rate))
            .build()
            .unwrap();
        Self {
            chaos,
            rows: Mutex::default(),
        }
    }

    fn write(&self, key: IdempotencyKey) -> u32 {
        let key = key.to_string();
        self.chaos.effect(&key);
        let mut rows = self.rows.lock().unwrap();
        let row = rows.entry(key).or_default();
        *row += 1;
        *row
    }

    fn find(&self, key: IdempotencyKey) -> std::future::Ready<Result<Option<u32>, Error>> {
        std::future::ready(Ok(self.rows.lock().unwrap().get(&key.to_string()).copied()))
    }

    #[retryable(deadline = "2s", max_attempts = 6, idempotent = false, attempt = at,
                reconcile = |key| self.find(key), budget = "none",
                backoff = "constant", initial_backoff = "10ms")]
    async fn safe(&self) -> Result<u32, Error> {
        let key = at.idempotency_key();
        self.chaos
            .around("ledger.write", async { Ok(self.write(key)) })
            .await
    }

    #[retryable(deadline = "2s", max_attempts = 6, idempotent, attempt = at, budget = "none",
                backoff = "constant", initial_backoff = "10ms")]
    async fn blind(&self) -> Result<u32, Error> {
        let key = at.idempotency_key();
        self.chaos
            .around("ledger.write", async { Ok(self.write(key)) })
            .await
    }
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_in_code_is_reconciled_by_key_and_never_written_twice() {
    let ledger = Ledger::new(0.5);
    for _ in 0..50 {
        assert_eq!(ledger.safe().await.unwrap(), 1);
    }
    // The seed fixes the draws: 18 answers lost, each found by `reconcile`.
    let report = ledger.chaos.report();
    assert_eq!(
        (report.requests, report.effects, report.duplicate_effects),
        (50, 50, 0)
    );
    assert_eq!(report.observed(FaultKind::DropReply), 18);
    assert_eq!(report.observed(FaultKind::Delay), 27);

    let blind = Ledger::new(0.5);
    for _ in 0..50 {
        let _ = blind.blind().await;
    }
    // Each lost answer retried blindly is a second write.
    let report = blind.chaos.report();
    assert_eq!(
        (report.requests, report.effects, report.duplicate_effects),
        (87, 87, 37)
    );
    assert_eq!(report.observed(FaultKind::DropReply), 37);
}
