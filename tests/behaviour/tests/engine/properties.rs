//! Property test: random fault scripts under random policies, on the paused
//! clock. Whatever happens, the call keeps its promises: attempts ≤
//! `max_attempts`; elapsed ≤ deadline − reserve; no attempt after an unknown
//! outcome of a non-idempotent call without `reconcile`; with a correct
//! `reconcile`, the work is done at most once.

use crate::common;

use common::{Service, Step, ms};
use proptest::prelude::*;
use retries::{Attempt, Backoff, Jitter, Policy, Reason};
use std::time::Duration;

use tokio::time::Instant;

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

static BASES: [Step; 4] = [
    Step::Succeed,
    Step::FailBefore,
    Step::FailAfter,
    Step::FailPermanent,
];

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..4usize).prop_map(|i| BASES[i]),
        1 => Just(Step::Hang),
        1 => (0u64..400).prop_map(|d| Step::Pushback(ms(d))),
        3 => (1u64..1500, 0..4usize).prop_map(|(d, i)| Step::After(ms(d), &BASES[i])),
    ]
}

fn policy() -> impl Strategy<Value = Policy> {
    let backoff = prop_oneof![
        (0u64..300).prop_map(|d| Backoff::constant(ms(d))),
        (1u64..200, 1.0f64..4.0).prop_map(|(d, m)| Backoff::exponential(ms(d), m, ms(2000))),
        (1u64..200).prop_map(|d| Backoff::decorrelated(ms(d), ms(1000))),
        (1u64..200, 0.0f64..=1.0)
            .prop_map(|(d, f)| Backoff::linear(ms(d), ms(d), ms(900))
                .with_jitter(Jitter::Proportional(f))),
    ];
    (
        50u64..5000,
        1u32..6,
        proptest::option::of(10u64..2000),
        0u64..100,
        0u64..20,
        backoff,
    )
        .prop_map(
            |(deadline, attempts, timeout, reserve_pct, min_attempt, backoff)| {
                let mut p = Policy::new(ms(deadline))
                    .with_max_attempts(attempts)
                    .with_reserve(ms(deadline * reserve_pct / 200))
                    .with_min_attempt(ms(min_attempt))
                    .with_backoff(backoff);
                if let Some(t) = timeout {
                    p = p.with_attempt_timeout(ms(t));
                }
                p
            },
        )
        .prop_filter("valid policies", |p| p.validate().is_ok())
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Idempotent,
    NotIdempotent,
    Reconciled,
}

fn check(script: &[Step], policy: Policy, mode: Mode) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let svc = Service::new(script);
        let t0 = Instant::now();
        let op = async |at: &Attempt| svc.call(at.number(), at.idempotency_key()).await;
        let result = match mode {
            Mode::Idempotent => call(&policy).idempotent().outcome(op).await,
            Mode::NotIdempotent => call(&policy).not_idempotent().outcome(op).await,
            Mode::Reconciled => {
                call(&policy)
                    .not_idempotent()
                    .reconcile(|key| svc.lookup(key))
                    .outcome(op)
                    .await
            }
        };
        let elapsed = t0.elapsed();
        let usable = policy.usable();
        let attempts = svc.attempts();

        prop_assert!(attempts >= 1);
        prop_assert!(attempts <= policy.max_attempts() as usize);
        prop_assert!(elapsed <= usable, "elapsed {elapsed:?} > usable {usable:?}");
        for start in svc.starts(t0).iter().skip(1) {
            prop_assert!(
                *start + policy.min_attempt() <= usable,
                "a retry started too late: {start:?}"
            );
        }
        if let Err(f) = &result {
            prop_assert_eq!(f.attempts() as usize, attempts);
            prop_assert!(f.elapsed() <= elapsed);
        } else {
            prop_assert!(svc.effects() >= 1, "success without the work");
        }
        prop_assert!(svc.distinct_effects() <= 1, "one key per call");
        match mode {
            Mode::Idempotent => {}
            Mode::NotIdempotent => {
                // No attempt follows one that may have run.
                if let Some(first) = svc.first_unknown_outcome() {
                    prop_assert!(attempts <= first + 1, "retried after an unknown outcome");
                }
                prop_assert!(svc.effects() <= 1);
            }
            Mode::Reconciled => {
                prop_assert!(svc.effects() <= 1, "work done {} times", svc.effects());
                if svc.effects() == 1
                    && let Err(f) = &result
                {
                    // The work was done but the call did not learn it: only
                    // possible when time ran out before `reconcile` answered.
                    prop_assert_eq!(f.reason(), Reason::DeadlineExceeded);
                }
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn idempotent_calls_keep_their_limits(script in prop::collection::vec(step(), 0..8), policy in policy()) {
        check(&script, policy, Mode::Idempotent)?;
    }

    #[test]
    fn non_idempotent_calls_never_retry_an_unknown_outcome(script in prop::collection::vec(step(), 0..8), policy in policy()) {
        check(&script, policy, Mode::NotIdempotent)?;
    }

    #[test]
    fn reconciled_calls_do_the_work_at_most_once(script in prop::collection::vec(step(), 0..8), policy in policy()) {
        check(&script, policy, Mode::Reconciled)?;
    }
}

#[tokio::test(start_paused = true)]
async fn the_checker_sees_unknown_outcomes() {
    // Guard against a property that cannot fail: the service must report an
    // attempt that failed after the work, and one cut off mid-flight.
    let svc = Service::new(&[Step::FailBefore, Step::FailAfter]);
    let key = retries::IdempotencyKey::from_u128(1);
    let _ = svc.call(1, key).await;
    assert_eq!(svc.first_unknown_outcome(), None);
    let _ = svc.call(2, key).await;
    assert_eq!(svc.first_unknown_outcome(), Some(1));
    let svc = Service::new(&[Step::Hang]);
    let _ = tokio::time::timeout(ms(5), svc.call(1, key)).await;
    assert_eq!(svc.first_unknown_outcome(), Some(0));
}

/// Durations from zero to `Duration::MAX`, the edges included.
fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        Just(Duration::from_nanos(1)),
        (0u64..5_000_000).prop_map(Duration::from_micros),
        any::<u64>().prop_map(Duration::from_nanos),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Hostile policies built at run time (every value at its edges, rules
    /// broken on purpose): the engine never panics, never overflows, makes at
    /// least one and at most `max(1, max_attempts)` attempts, and ends.
    #[test]
    fn hostile_policies_never_panic(
        deadline in any_duration(),
        attempts in prop_oneof![Just(0u32), Just(1), Just(u32::MAX), 0u32..6],
        attempt_timeout in proptest::option::of(any_duration()),
        reserve in any_duration(),
        min_attempt in any_duration(),
        backoff in prop_oneof![
            any_duration().prop_map(Backoff::constant),
            (any_duration(), -10.0f64..1e300, any_duration())
                .prop_map(|(i, m, c)| Backoff::exponential(i, m, c)),
            (any_duration(), any_duration()).prop_map(|(i, c)| Backoff::decorrelated(i, c)),
            (any_duration(), -2.0f64..3.0)
                .prop_map(|(d, f)| Backoff::constant(d).with_jitter(Jitter::Proportional(f))),
        ],
        fail in 0u32..8,
    ) {
        let mut p = Policy::new(deadline)
            .with_max_attempts(attempts)
            .with_reserve(reserve)
            .with_min_attempt(min_attempt)
            .with_backoff(backoff);
        if let Some(t) = attempt_timeout {
            p = p.with_attempt_timeout(t);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let made = rt.block_on(async {
            let made = std::cell::Cell::new(0u32);
            let r = tokio::time::timeout(Duration::from_hours(1), call(&p)
                .idempotent()
                .budget(retries::NoBudget)
                .outcome(async |at: &Attempt| {
                    made.set(made.get() + 1);
                    if at.number() <= fail {
                        Err(common::SvcError::NotExecuted(None))
                    } else {
                        Ok(at.number())
                    }
                }))
                .await;
            // Ends: by itself, or (a deadline of centuries) within the hour
            // only when the pauses are that long.
            if let Ok(Ok(n)) = r {
                assert_eq!(n, made.get());
            }
            made.get()
        });
        prop_assert!(made >= 1);
        prop_assert!(made <= attempts.max(1));
    }
}
