//! Property test of the rule that makes nesting safe: however the layers are
//! stacked (each idempotent or not, deferring or owning its retries), once a
//! non-idempotent effect at the bottom has an unresolved unknown outcome, no
//! layer repeats it within the same top-level call. Random fault scripts on
//! the paused clock.

use std::sync::Mutex;
use std::time::Duration;

use proptest::prelude::*;
use retries::{Attempt, Backoff, Classify, Nested, NoBudget, Policy, Verdict};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    /// Refused before running (not executed).
    Refuse,
    /// Ran, then the reply was lost (unknown).
    RanThenLost,
    /// Ran and answered.
    Ran,
    /// Rejected (permanent, not run).
    Reject,
}

#[derive(Debug, thiserror::Error)]
enum E {
    #[error("refused")]
    Refused,
    #[error("lost")]
    Lost,
    #[error("rejected")]
    Rejected,
    #[error(transparent)]
    Stopped(#[from] retries::Stopped),
}

impl Classify for E {
    fn classify(&self) -> Verdict {
        match self {
            E::Refused => Verdict::not_executed(),
            E::Lost => Verdict::unknown(),
            E::Rejected | E::Stopped(_) => Verdict::permanent(),
        }
    }
}

/// The bottom operation: follows the script and logs what it did.
struct Bottom {
    script: Mutex<Vec<Step>>,
    log: Mutex<Vec<Step>>,
}

impl Bottom {
    async fn call(&self) -> Result<u32, E> {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let step = {
            let mut s = self.script.lock().unwrap();
            if s.is_empty() { Step::Ran } else { s.remove(0) }
        };
        self.log.lock().unwrap().push(step);
        match step {
            Step::Refuse => Err(E::Refused),
            Step::RanThenLost => Err(E::Lost),
            Step::Ran => Ok(1),
            Step::Reject => Err(E::Rejected),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Layer {
    idempotent: bool,
    own: bool,
    attempts: u32,
}

fn layer() -> impl Strategy<Value = Layer> {
    (any::<bool>(), any::<bool>(), 1u32..4).prop_map(|(idempotent, own, attempts)| Layer {
        idempotent,
        own,
        attempts,
    })
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => Just(Step::Refuse),
        2 => Just(Step::RanThenLost),
        1 => Just(Step::Ran),
        1 => Just(Step::Reject),
    ]
}

/// Run `bottom` under `layers` (outermost first); the bottom call itself is
/// not idempotent.
async fn stacked(layers: &[Layer], bottom: &Bottom) -> Result<u32, E> {
    match layers.split_first() {
        None => {
            let p = Policy::new(Duration::from_secs(10))
                .with_max_attempts(3)
                .with_backoff(Backoff::constant(Duration::from_millis(2)));
            retries::call(&p)
                .not_idempotent()
                .budget(NoBudget)
                .nested(Nested::Own)
                .run(async |_: &Attempt| bottom.call().await)
                .await
        }
        Some((l, rest)) => {
            let p = Policy::new(Duration::from_secs(10))
                .with_max_attempts(l.attempts)
                .with_backoff(Backoff::constant(Duration::from_millis(2)));
            let nested = if l.own { Nested::Own } else { Nested::Defer };
            let call = retries::call(&p).budget(NoBudget).nested(nested);
            let body = async |_: &Attempt| Box::pin(stacked(rest, bottom)).await;
            if l.idempotent {
                call.idempotent().run(body).await
            } else {
                call.not_idempotent().run(body).await
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn no_layering_repeats_an_unresolved_unknown_effect(
        layers in proptest::collection::vec(layer(), 0..4),
        script in proptest::collection::vec(step(), 0..8),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let bottom = Bottom { script: Mutex::new(script), log: Mutex::new(Vec::new()) };
        let result = rt.block_on(stacked(&layers, &bottom));
        let log = bottom.log.into_inner().unwrap();
        // Nothing runs after an effect whose outcome was lost.
        if let Some(i) = log.iter().position(|s| *s == Step::RanThenLost) {
            prop_assert_eq!(i, log.len() - 1, "repeated after an unknown outcome: {:?} under {:?}", log, layers);
            prop_assert!(matches!(result, Err(E::Lost)), "{:?}", result);
        }
        // The work was done at most once in all.
        let ran = log.iter().filter(|s| matches!(s, Step::Ran | Step::RanThenLost)).count();
        prop_assert!(ran <= 1, "{:?}", log);
        if let Ok(v) = result {
            prop_assert_eq!(v, 1);
            prop_assert_eq!(log.last(), Some(&Step::Ran));
        }
    }
}
