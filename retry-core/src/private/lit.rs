//! A policy written in `#[retryable]` with literal values only, as a type:
//! its values are the type's const parameters, and its `const`s are
//! evaluated by rustc once per distinct type, so the functions of a crate
//! that write the same keys with the same values share one evaluation of
//! their policy (with a `const` item per function, each was evaluated:
//! rustc's instructions for 200 functions went 11.33 → 10.89 G,
//! `scripts/compile-time.sh --instructions`). Not public API.
//!
//! The attribute writes the parameters; their layout is this file's:
//!
//! * `head`: the deadline in nanoseconds (bits 0–63), `max_attempts` (64–95),
//!   the backoff's kind as the code of [`kind`] (96–103), and one bit per
//!   key written, [`MAX_ATTEMPTS`] to [`JITTER`], from bit 104 (the
//!   deadline is always written: without `policy = …` it is required);
//! * `limits`: `attempt_timeout` then `reserve`, `pauses`: `min_attempt`
//!   then `initial_backoff`, `growth`: `max_backoff` then the multiplier,
//!   each in its 64 bits (durations in nanoseconds, the multiplier as
//!   `f64::to_bits`); `spread`: a proportional jitter's fraction
//!   (`to_bits`) then the jitter's code of [`jitter`];
//! * a key not written is 0 and its bit clear.
//!
//! [`Lit`] carries `head` alone, for the attributes that write no other key;
//! [`LitAll`] all five.
//!
//! The keys are applied in the attribute's order (see `policy_chain` in
//! `retries-macros`), so that a later key refines an earlier one.

use std::time::Duration;

use super::Broken;
use crate::backoff::{BackoffKind, Jitter};
use crate::policy::Policy;

/// `max_attempts` was written.
pub const MAX_ATTEMPTS: u32 = 1;
/// `backoff = "…"` (a kind) was written.
pub const BACKOFF: u32 = 1 << 1;
/// `attempt_timeout` was written.
pub const ATTEMPT_TIMEOUT: u32 = 1 << 2;
/// `reserve` was written.
pub const RESERVE: u32 = 1 << 3;
/// `min_attempt` was written.
pub const MIN_ATTEMPT: u32 = 1 << 4;
/// `initial_backoff` was written.
pub const INITIAL_BACKOFF: u32 = 1 << 5;
/// `max_backoff` was written.
pub const MAX_BACKOFF: u32 = 1 << 6;
/// `multiplier` was written.
pub const MULTIPLIER: u32 = 1 << 7;
/// `jitter` was written.
pub const JITTER: u32 = 1 << 8;

/// The keys of the bits above, in their order, for the blame of a rule.
const KEYS: [(u32, &str); 10] = [
    (0, "deadline"),
    (MAX_ATTEMPTS, "max_attempts"),
    (BACKOFF, "backoff"),
    (ATTEMPT_TIMEOUT, "attempt_timeout"),
    (RESERVE, "reserve"),
    (MIN_ATTEMPT, "min_attempt"),
    (INITIAL_BACKOFF, "initial_backoff"),
    (MAX_BACKOFF, "max_backoff"),
    (MULTIPLIER, "multiplier"),
    (JITTER, "jitter"),
];

/// The backoff kind of code `k`: 0 constant, 1 linear, 2 exponential, 3
/// decorrelated, 4 gRPC's.
#[must_use]
pub const fn kind(k: u8) -> BackoffKind {
    match k {
        0 => BackoffKind::Constant,
        1 => BackoffKind::Linear,
        2 => BackoffKind::Exponential,
        3 => BackoffKind::Decorrelated,
        _ => BackoffKind::Grpc,
    }
}

/// The jitter of code `j` (0 none, 1 full, 2 equal, 3 decorrelated, 4
/// proportional to the fraction whose bits are `f`).
#[must_use]
pub const fn jitter(j: u8, f: u64) -> Jitter {
    match j {
        0 => Jitter::None,
        1 => Jitter::Full,
        2 => Jitter::Equal,
        3 => Jitter::Decorrelated,
        _ => Jitter::Proportional(f64::from_bits(f)),
    }
}

/// The policy of the values packed in `head`, `limits`, `pauses`,
/// `growth` and `spread` (see the module docs):
/// `Policy::new(deadline)`, then each key written, in the attribute's
/// order.
#[must_use]
pub const fn policy(head: u128, limits: u128, pauses: u128, growth: u128, spread: u128) -> Policy {
    let given = (head >> 104) as u32;
    let mut policy = Policy::new(low(head));
    if given & MAX_ATTEMPTS != 0 {
        policy = policy.with_max_attempts((head >> 64) as u32);
    }
    if given & BACKOFF != 0 {
        policy = policy.with_backoff_kind(kind((head >> 96) as u8));
    }
    if given & ATTEMPT_TIMEOUT != 0 {
        policy = policy.with_attempt_timeout(low(limits));
    }
    if given & RESERVE != 0 {
        policy = policy.with_reserve(high(limits));
    }
    if given & MIN_ATTEMPT != 0 {
        policy = policy.with_min_attempt(low(pauses));
    }
    if given & INITIAL_BACKOFF != 0 {
        policy = policy.with_initial_backoff(high(pauses));
    }
    if given & MAX_BACKOFF != 0 {
        policy = policy.with_max_backoff(low(growth));
    }
    if given & MULTIPLIER != 0 {
        policy = policy.with_multiplier(f64::from_bits((growth >> 64) as u64));
    }
    if given & JITTER != 0 {
        policy = policy.with_jitter(jitter((spread >> 64) as u8, spread as u64));
    }
    policy
}

/// The duration of the low 64 bits of `x`, in nanoseconds.
const fn low(x: u128) -> Duration {
    Duration::from_nanos(x as u64)
}

/// The duration of the high 64 bits of `x`, in nanoseconds.
const fn high(x: u128) -> Duration {
    Duration::from_nanos((x >> 64) as u64)
}

/// A literal policy of the deadline, `max_attempts` and a backoff kind
/// only, the keys most attributes write, packed in one parameter (see the
/// module docs): each const parameter a function names costs its
/// compilation, about 50 k of rustc's instructions a use (twelve
/// parameters, one per key, cost more than the evaluations they saved).
#[derive(Debug)]
pub struct Lit<const A: u128>;

impl<const A: u128> Lit<A> {
    /// The policy.
    pub const POLICY: Policy = policy(A, 0, 0, 0, 0);
    /// What it breaks, if anything.
    pub const BROKEN: Broken =
        super::broken_by(&Self::POLICY, super::Written::Bits((A >> 104) as u32));
}

/// A literal policy with any of the keys (see the module docs).
#[derive(Debug)]
pub struct LitAll<const A: u128, const B: u128, const C: u128, const D: u128, const E: u128>;

impl<const A: u128, const B: u128, const C: u128, const D: u128, const E: u128>
    LitAll<A, B, C, D, E>
{
    /// The policy.
    pub const POLICY: Policy = policy(A, B, C, D, E);
    /// What it breaks, if anything.
    pub const BROKEN: Broken =
        super::broken_by(&Self::POLICY, super::Written::Bits((A >> 104) as u32));
}

/// Was `key` written, by the bits `given` (the deadline always is)?
pub(super) const fn written(given: u32, key: &str) -> bool {
    let mut j = 0;
    while j < KEYS.len() {
        let (bit, name) = KEYS[j];
        if super::str_eq(key, name) {
            return bit == 0 || given & bit != 0;
        }
        j += 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u128 = 1_000_000;

    /// `head` as the attribute writes it.
    const fn head(deadline: u128, attempts: u128, kind: u128, given: u32) -> u128 {
        deadline | (attempts << 64) | (kind << 96) | ((given as u128) << 104)
    }

    /// Two values in one parameter.
    const fn pack(low: u128, high: u128) -> u128 {
        low | (high << 64)
    }

    type Bare = Lit<{ head(2_000 * MS, 3, 0, MAX_ATTEMPTS) }>;

    const ALL: u32 = MAX_ATTEMPTS
        | BACKOFF
        | ATTEMPT_TIMEOUT
        | RESERVE
        | MIN_ATTEMPT
        | INITIAL_BACKOFF
        | MAX_BACKOFF
        | MULTIPLIER
        | JITTER;

    type Full = LitAll<
        { head(5_000 * MS, 4, 2, ALL) },
        { pack(800 * MS, 100 * MS) },
        { pack(5 * MS, 20 * MS) },
        { pack(1_000 * MS, 2.5f64.to_bits() as u128) },
        { pack(0.25f64.to_bits() as u128, 4) },
    >;

    type Zero = Lit<{ head(2_000 * MS, 0, 0, MAX_ATTEMPTS) }>;

    type Reserve = LitAll<{ head(10 * MS, 0, 0, RESERVE) }, { pack(0, 10 * MS) }, 0, 0, 0>;

    #[test]
    fn the_type_builds_the_chain_the_attribute_wrote() {
        assert_eq!(
            Bare::POLICY,
            Policy::new(Duration::from_secs(2)).with_max_attempts(3)
        );
        assert_eq!(Bare::BROKEN, None);
        let ms = Duration::from_millis;
        assert_eq!(
            Full::POLICY,
            Policy::new(ms(5_000))
                .with_max_attempts(4)
                .with_backoff_kind(BackoffKind::Exponential)
                .with_attempt_timeout(ms(800))
                .with_reserve(ms(100))
                .with_min_attempt(ms(5))
                .with_initial_backoff(ms(20))
                .with_max_backoff(ms(1_000))
                .with_multiplier(2.5)
                .with_jitter(Jitter::Proportional(0.25))
        );
        assert_eq!(Full::BROKEN, None);
    }

    #[test]
    fn a_broken_rule_is_blamed_on_a_key_written() {
        // Zero attempts: blamed on `max_attempts`, which was written.
        let (blamed, e) = Zero::BROKEN.expect("broken");
        assert_eq!(blamed, Some("max_attempts"));
        assert_eq!(
            Some(e),
            Policy::new(Duration::from_secs(2))
                .with_max_attempts(0)
                .validate()
                .err()
        );
        // A reserve not below the deadline: the first of the rule's keys
        // written is blamed, as `broken` does.
        let p = Policy::new(Duration::from_millis(10)).with_reserve(Duration::from_millis(10));
        assert_eq!(
            Reserve::BROKEN,
            super::super::broken(&p, &["deadline", "reserve"])
        );
    }
}
