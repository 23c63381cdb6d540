//! A policy written in `#[retryable]` with literal values only, as a type:
//! its values are the type's const parameters, and its `const`s are
//! evaluated by rustc once per distinct type, so the functions of a crate
//! that write the same keys with the same values share one evaluation of
//! their policy (a `const` item per function was evaluated per function:
//! 0.35 G of rustc's 11.2 G instructions for 200 functions,
//! `scripts/compile-time.sh --instructions`). Not public API.
//!
//! The attribute writes the parameters; their layout is this file's:
//!
//! * `a`: the deadline in nanoseconds (bits 0–63), `max_attempts` (64–95),
//!   the backoff's kind as the code of [`kind`] (96–103), and one bit per
//!   key written, [`MAX_ATTEMPTS`] to [`JITTER`], from bit 104 (the
//!   deadline is always written: without `policy = …` it is required);
//! * `b`: `attempt_timeout` then `reserve`, `c`: `min_attempt` then
//!   `initial_backoff`, `d`: `max_backoff` then the multiplier, each in
//!   its 64 bits (durations in nanoseconds, the multiplier as
//!   `f64::to_bits`); `e`: a proportional jitter's fraction (`to_bits`)
//!   then the jitter's code of [`jitter`];
//! * a key not written is 0 and its bit clear.
//!
//! [`Lit`] carries `a` alone, for the attributes that write no other key;
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

/// The policy of the values packed in `a`..`e` (see the module docs):
/// `Policy::new(deadline)`, then each key written, in the attribute's
/// order.
#[must_use]
pub const fn policy(a: u128, b: u128, c: u128, d: u128, e: u128) -> Policy {
    let given = (a >> 104) as u32;
    let mut p = Policy::new(low(a));
    if given & MAX_ATTEMPTS != 0 {
        p = p.with_max_attempts((a >> 64) as u32);
    }
    if given & BACKOFF != 0 {
        p = p.with_backoff_kind(kind((a >> 96) as u8));
    }
    if given & ATTEMPT_TIMEOUT != 0 {
        p = p.with_attempt_timeout(low(b));
    }
    if given & RESERVE != 0 {
        p = p.with_reserve(high(b));
    }
    if given & MIN_ATTEMPT != 0 {
        p = p.with_min_attempt(low(c));
    }
    if given & INITIAL_BACKOFF != 0 {
        p = p.with_initial_backoff(high(c));
    }
    if given & MAX_BACKOFF != 0 {
        p = p.with_max_backoff(low(d));
    }
    if given & MULTIPLIER != 0 {
        p = p.with_multiplier(f64::from_bits((d >> 64) as u64));
    }
    if given & JITTER != 0 {
        p = p.with_jitter(jitter((e >> 64) as u8, e as u64));
    }
    p
}

/// The duration of the low 64 bits of `x`, in nanoseconds.
const fn low(x: u128) -> Duration {
    Duration::from_nanos(x as u64)
}

/// The duration of the high 64 bits of `x`, in nanoseconds.
const fn high(x: u128) -> Duration {
    Duration::from_nanos((x >> 64) as u64)
}

/// What `policy` breaks, blamed on the first key written that the rule
/// concerns (as [`broken`](super::broken)).
const fn broken(policy: &Policy, given: u32) -> Broken {
    match policy.validate() {
        Ok(()) => None,
        Err(e) => Some((blamed(e.keys(), given), e)),
    }
}

/// A literal policy of the deadline, `max_attempts` and a backoff kind
/// only, the keys most attributes write, packed in one parameter (see the
/// module docs): each const parameter a function names costs its
/// compilation, about 40 k instructions of rustc's a use.
#[derive(Debug)]
pub struct Lit<const A: u128>;

impl<const A: u128> Lit<A> {
    /// The policy.
    pub const POLICY: Policy = policy(A, 0, 0, 0, 0);
    /// What it breaks, if anything.
    pub const BROKEN: Broken = broken(&Self::POLICY, (A >> 104) as u32);
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
    pub const BROKEN: Broken = broken(&Self::POLICY, (A >> 104) as u32);
}

/// The first of `keys` that was written (the deadline always is).
const fn blamed(keys: &[&'static str], given: u32) -> Option<&'static str> {
    let mut i = 0;
    while i < keys.len() {
        let mut j = 0;
        while j < KEYS.len() {
            let (bit, name) = KEYS[j];
            if (bit == 0 || given & bit != 0) && super::str_eq(keys[i], name) {
                return Some(keys[i]);
            }
            j += 1;
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u128 = 1_000_000;
    const fn given(bits: u32) -> u128 {
        (bits as u128) << 104
    }

    #[test]
    fn the_type_builds_the_chain_the_attribute_wrote() {
        type Bare = Lit<{ 2_000 * MS | 3 << 64 | given(MAX_ATTEMPTS) }>;
        assert_eq!(
            Bare::POLICY,
            Policy::new(Duration::from_secs(2)).with_max_attempts(3)
        );
        assert_eq!(Bare::BROKEN, None);
        type Full = LitAll<
            {
                5_000 * MS
                    | 4 << 64
                    | 2 << 96
                    | given(
                        MAX_ATTEMPTS
                            | BACKOFF
                            | ATTEMPT_TIMEOUT
                            | RESERVE
                            | MIN_ATTEMPT
                            | INITIAL_BACKOFF
                            | MAX_BACKOFF
                            | MULTIPLIER
                            | JITTER,
                    )
            },
            { 800 * MS | (100 * MS) << 64 },
            { 5 * MS | (20 * MS) << 64 },
            { 1_000 * MS | (0x4004_0000_0000_0000 << 64) }, // 2.5
            { 0x3FD0_0000_0000_0000 | 4 << 64 },            // 0.25, proportional
        >;
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
        type Zero = Lit<{ 2_000 * MS | given(MAX_ATTEMPTS) }>;
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
        type Reserve = LitAll<{ 10 * MS | given(RESERVE) }, { (10 * MS) << 64 }, 0, 0, 0>;
        let p = Policy::new(Duration::from_millis(10)).with_reserve(Duration::from_millis(10));
        assert_eq!(
            Reserve::BROKEN,
            super::super::broken(&p, &["deadline", "reserve"])
        );
    }
}
