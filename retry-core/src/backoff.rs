//! Pauses between attempts: a base sequence ([`BackoffKind`]) and a [`Jitter`].
//!
//! Every delay is a pure function of the pause number, the previous pause and a
//! random source, so it can be tested exactly. All arithmetic saturates: no
//! attempt number, multiplier or duration overflows or panics, and a delay never
//! exceeds the cap (with proportional jitter: `cap · (1 + f)`).
//!
//! | kind | pause `n` (1-based), before jitter |
//! |---|---|
//! | constant | `delay` |
//! | linear | `min(max, initial + step · (n − 1))` |
//! | exponential | `min(max, initial · multiplier^(n − 1))` |
//! | decorrelated | `min(max, initial · 3^(n − 1))` as the envelope; its default jitter is `Decorrelated` |
//!
//! | jitter | delay for a base `d` |
//! |---|---|
//! | none | `d` |
//! | full | `U(0, d)` |
//! | equal | `d/2 + U(0, d/2)` |
//! | proportional `f` | `d · U(1 − f, 1 + f)` (gRPC uses `f = 0.2`) |
//! | decorrelated | `min(max, U(initial, 3 · previous))`, the previous pause starting at `initial` |
//!
//! The default ([`Backoff::DEFAULT`]) is exponential from 100 ms, ×2, capped at
//! 1 s, with full jitter.

use std::fmt;
use std::time::Duration;

use rand::{Rng, RngExt};

use crate::policy::PolicyError;

/// The base sequence of pauses. See the [module docs](self) for the formulas.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BackoffKind {
    /// The same pause every time.
    Constant {
        /// The pause.
        delay: Duration,
    },
    /// A pause growing by `step` each time, capped at `max`.
    Linear {
        /// The first pause.
        initial: Duration,
        /// Added for each further pause.
        step: Duration,
        /// The cap.
        max: Duration,
    },
    /// A pause multiplied by `multiplier` each time, capped at `max`.
    Exponential {
        /// The first pause.
        initial: Duration,
        /// The growth factor, at least 1.
        multiplier: f64,
        /// The cap.
        max: Duration,
    },
    /// "Decorrelated jitter": each pause drawn between `initial` and three times
    /// the previous one, capped at `max`.
    Decorrelated {
        /// The smallest pause.
        initial: Duration,
        /// The cap.
        max: Duration,
    },
}

/// Randomisation applied to the base pause. See the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// The base pause exactly.
    None,
    /// Uniform in `[0, d]`.
    Full,
    /// `d/2` plus uniform in `[0, d/2]`.
    Equal,
    /// `d` times uniform in `[1 − f, 1 + f]`; `f` must lie in `[0, 1]`.
    Proportional(f64),
    /// Uniform in `[initial, 3 · previous]`, capped.
    Decorrelated,
}

/// A backoff: a [`BackoffKind`] and a [`Jitter`]. `const`-constructible.
///
/// ```
/// use std::time::Duration;
/// use retry_core::{Backoff, Jitter};
///
/// const B: Backoff = Backoff::exponential(Duration::from_millis(100), 2.0, Duration::from_secs(1))
///     .with_jitter(Jitter::None);
/// let mut rng = rand::rng();
/// let prev = Duration::ZERO;
/// assert_eq!(B.delay(1, prev, &mut rng), Duration::from_millis(100));
/// assert_eq!(B.delay(3, prev, &mut rng), Duration::from_millis(400));
/// assert_eq!(B.delay(60, prev, &mut rng), Duration::from_secs(1)); // capped, no overflow
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    kind: BackoffKind,
    jitter: Jitter,
}

const fn nanos(d: Duration) -> u64 {
    let n = d.as_nanos();
    if n > u64::MAX as u128 {
        u64::MAX
    } else {
        n as u64
    }
}

/// Converts a non-negative float count of nanoseconds to a `Duration`,
/// saturating at `u64::MAX` nanoseconds (NaN maps to the saturated value too,
/// so a broken computation never yields a zero pause).
fn from_nanos_f64(x: f64) -> Duration {
    if x.is_nan() || x >= u64::MAX as f64 {
        Duration::from_nanos(u64::MAX)
    } else if x <= 0.0 {
        Duration::ZERO
    } else {
        Duration::from_nanos(x as u64)
    }
}

impl Backoff {
    /// The default: exponential from 100 ms, ×2, capped at 1 s, full jitter.
    pub const DEFAULT: Self =
        Self::exponential(Duration::from_millis(100), 2.0, Duration::from_secs(1));

    /// No pause at all between attempts.
    pub const NONE: Self = Self::constant(Duration::ZERO);

    /// The same pause every time, without jitter.
    #[must_use]
    pub const fn constant(delay: Duration) -> Self {
        Self {
            kind: BackoffKind::Constant { delay },
            jitter: Jitter::None,
        }
    }

    /// `initial`, `initial + step`, … capped at `max`, without jitter.
    #[must_use]
    pub const fn linear(initial: Duration, step: Duration, max: Duration) -> Self {
        Self {
            kind: BackoffKind::Linear { initial, step, max },
            jitter: Jitter::None,
        }
    }

    /// `initial · multiplier^(n−1)` capped at `max`, with full jitter.
    #[must_use]
    pub const fn exponential(initial: Duration, multiplier: f64, max: Duration) -> Self {
        Self {
            kind: BackoffKind::Exponential {
                initial,
                multiplier,
                max,
            },
            jitter: Jitter::Full,
        }
    }

    /// Decorrelated jitter between `initial` and `max`.
    #[must_use]
    pub const fn decorrelated(initial: Duration, max: Duration) -> Self {
        Self {
            kind: BackoffKind::Decorrelated { initial, max },
            jitter: Jitter::Decorrelated,
        }
    }

    /// The same kind with another jitter.
    #[must_use]
    pub const fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The kind of this backoff.
    #[must_use]
    pub const fn kind(&self) -> BackoffKind {
        self.kind
    }

    /// The jitter of this backoff.
    #[must_use]
    pub const fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The first pause (before jitter).
    #[must_use]
    pub const fn initial(&self) -> Duration {
        match self.kind {
            BackoffKind::Constant { delay } => delay,
            BackoffKind::Linear { initial, .. }
            | BackoffKind::Exponential { initial, .. }
            | BackoffKind::Decorrelated { initial, .. } => initial,
        }
    }

    /// The cap (before jitter).
    #[must_use]
    pub const fn max(&self) -> Duration {
        match self.kind {
            BackoffKind::Constant { delay } => delay,
            BackoffKind::Linear { max, .. }
            | BackoffKind::Exponential { max, .. }
            | BackoffKind::Decorrelated { max, .. } => max,
        }
    }

    /// Check the parameters: multiplier finite and at least 1, jitter factor in
    /// `[0, 1]`, cap not below the first pause.
    pub const fn validate(&self) -> Result<(), PolicyError> {
        if let BackoffKind::Exponential { multiplier, .. } = self.kind
            && !(multiplier >= 1.0 && multiplier.is_finite())
        {
            return Err(PolicyError::Multiplier);
        }
        if let Jitter::Proportional(f) = self.jitter
            && !(f >= 0.0 && f <= 1.0)
        {
            return Err(PolicyError::JitterFactor);
        }
        if nanos(self.max()) < nanos(self.initial()) {
            return Err(PolicyError::CapBelowInitial);
        }
        Ok(())
    }

    /// The pause before jitter for pause number `n` (1-based; 0 is treated as 1).
    #[must_use]
    pub fn base(&self, n: u32) -> Duration {
        let k = n.saturating_sub(1);
        match self.kind {
            BackoffKind::Constant { delay } => delay,
            BackoffKind::Linear { initial, step, max } => {
                let grown = step
                    .checked_mul(k)
                    .and_then(|s| initial.checked_add(s))
                    .unwrap_or(Duration::MAX);
                grown.min(max)
            }
            BackoffKind::Exponential {
                initial,
                multiplier,
                max,
            } => grow(initial, multiplier, k, max),
            BackoffKind::Decorrelated { initial, max } => grow(initial, 3.0, k, max),
        }
    }

    /// The pause for pause number `n` (1-based) after jitter, given the previous
    /// pause actually taken (`Duration::ZERO` for none) and a random source.
    pub fn delay<R: Rng + ?Sized>(&self, n: u32, prev: Duration, rng: &mut R) -> Duration {
        let d = self.base(n);
        match self.jitter {
            Jitter::None => d,
            Jitter::Full => uniform(rng, Duration::ZERO, d),
            Jitter::Equal => {
                let half = d / 2;
                half + uniform(rng, Duration::ZERO, d.saturating_sub(half))
            }
            Jitter::Proportional(f) => {
                let f = if f.is_nan() { 0.0 } else { f.clamp(0.0, 1.0) };
                let u: f64 = rng.random();
                from_nanos_f64(nanos(d) as f64 * (1.0 - f + 2.0 * f * u))
            }
            Jitter::Decorrelated => {
                let (lo, cap) = (self.initial(), self.max());
                let prev = if prev.is_zero() { lo } else { prev };
                let hi = prev.checked_mul(3).unwrap_or(Duration::MAX).max(lo);
                uniform(rng, lo, hi).min(cap)
            }
        }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            BackoffKind::Constant { delay } => write!(f, "constant {delay:?}")?,
            BackoffKind::Linear { initial, step, max } => {
                write!(f, "linear {initial:?} +{step:?} ≤{max:?}")?;
            }
            BackoffKind::Exponential {
                initial,
                multiplier,
                max,
            } => write!(f, "exponential {initial:?} ×{multiplier} ≤{max:?}")?,
            BackoffKind::Decorrelated { initial, max } => {
                write!(f, "decorrelated {initial:?} ≤{max:?}")?;
            }
        }
        match self.jitter {
            Jitter::None => Ok(()),
            Jitter::Full => f.write_str(", full jitter"),
            Jitter::Equal => f.write_str(", equal jitter"),
            Jitter::Proportional(x) => write!(f, ", ±{x} jitter"),
            Jitter::Decorrelated => f.write_str(", decorrelated jitter"),
        }
    }
}

/// `min(max, initial · m^k)`, saturating, never NaN.
fn grow(initial: Duration, m: f64, k: u32, max: Duration) -> Duration {
    if initial.is_zero() || k == 0 {
        return initial.min(max);
    }
    let m = if m.is_finite() && m >= 1.0 { m } else { 1.0 };
    let exp = i32::try_from(k).unwrap_or(i32::MAX);
    let x = nanos(initial) as f64 * m.powi(exp);
    if x >= nanos(max) as f64 {
        max
    } else {
        from_nanos_f64(x)
    }
}

/// Uniform in `[lo, hi]` at nanosecond resolution.
fn uniform<R: Rng + ?Sized>(rng: &mut R, lo: Duration, hi: Duration) -> Duration {
    let (lo, hi) = (nanos(lo), nanos(hi));
    if hi <= lo {
        return Duration::from_nanos(lo);
    }
    Duration::from_nanos(rng.random_range(lo..=hi))
}

#[cfg(test)]
#[allow(clippy::many_single_char_names)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn kinds_without_jitter() {
        let mut r = StdRng::seed_from_u64(1);
        let z = Duration::ZERO;
        let c = Backoff::constant(50 * MS);
        assert_eq!(c.delay(7, z, &mut r), 50 * MS);
        let l = Backoff::linear(10 * MS, 5 * MS, 22 * MS);
        let got: Vec<_> = (1..=4).map(|n| l.delay(n, z, &mut r)).collect();
        assert_eq!(got, [10 * MS, 15 * MS, 20 * MS, 22 * MS]);
        let e = Backoff::exponential(100 * MS, 2.0, 1000 * MS).with_jitter(Jitter::None);
        let got: Vec<_> = (1..=6).map(|n| e.delay(n, z, &mut r)).collect();
        assert_eq!(
            got,
            [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1000 * MS, 1000 * MS]
        );
    }

    #[test]
    fn no_overflow_anywhere() {
        let mut r = StdRng::seed_from_u64(2);
        let huge = Duration::MAX;
        for b in [
            Backoff::exponential(huge, 1e300, huge),
            Backoff::exponential(MS, f64::MAX, huge).with_jitter(Jitter::Proportional(1.0)),
            Backoff::linear(huge, huge, huge).with_jitter(Jitter::Equal),
            Backoff::decorrelated(huge, huge),
            Backoff::exponential(Duration::ZERO, 10.0, huge),
        ] {
            for n in [0, 1, 2, 63, 64, 1000, u32::MAX] {
                let d = b.delay(n, huge, &mut r);
                assert!(d <= huge, "{b}: {d:?}");
            }
        }
    }

    #[test]
    fn jitter_bounds() {
        let mut r = StdRng::seed_from_u64(3);
        let base = Backoff::constant(100 * MS);
        for _ in 0..2000 {
            let full = base.with_jitter(Jitter::Full).delay(1, MS, &mut r);
            assert!(full <= 100 * MS);
            let eq = base.with_jitter(Jitter::Equal).delay(1, MS, &mut r);
            assert!(eq >= 50 * MS && eq <= 100 * MS);
            let p = base
                .with_jitter(Jitter::Proportional(0.2))
                .delay(1, MS, &mut r);
            assert!(p >= 80 * MS && p <= 120 * MS, "{p:?}");
            let d = Backoff::decorrelated(10 * MS, 500 * MS).delay(1, 100 * MS, &mut r);
            assert!(d >= 10 * MS && d <= 300 * MS, "{d:?}");
            let d = Backoff::decorrelated(10 * MS, 500 * MS).delay(1, 400 * MS, &mut r);
            assert!(d >= 10 * MS && d <= 500 * MS, "{d:?}");
        }
    }

    #[test]
    fn validation() {
        assert_eq!(Backoff::DEFAULT.validate(), Ok(()));
        assert_eq!(
            Backoff::exponential(MS, 0.5, 2 * MS).validate(),
            Err(PolicyError::Multiplier)
        );
        assert_eq!(
            Backoff::exponential(MS, f64::NAN, 2 * MS).validate(),
            Err(PolicyError::Multiplier)
        );
        assert_eq!(
            Backoff::constant(MS)
                .with_jitter(Jitter::Proportional(1.5))
                .validate(),
            Err(PolicyError::JitterFactor)
        );
        assert_eq!(
            Backoff::linear(5 * MS, MS, 2 * MS).validate(),
            Err(PolicyError::CapBelowInitial)
        );
    }
}
