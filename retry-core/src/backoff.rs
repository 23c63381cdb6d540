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
//! | grpc (gRFC A6) | `initial` for the first pause, then `min(max, initial · multiplier^(n − 1))`; default jitter proportional 0.2 |
//!
//! The `grpc` kind follows the retry design of gRPC clients (gRFC A6,
//! "Exponential Backoff"): the first retry comes after
//! `initialBackoff · random(0.8, 1.2)`, the `n`-th after
//! `min(initialBackoff · backoffMultiplier^(n−1), maxBackoff) · random(0.8, 1.2)`.
//! So, unlike the exponential kind, its first pause is not capped, its
//! multiplier may be any positive number (below 1 the pauses shrink), and its
//! cap may lie below its first pause; [`Backoff::grpc`] builds one.
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

use rand::RngExt;

use crate::rules::PolicyError;

/// The base sequence of pauses. See the [module docs](self) for the formulas.
/// More kinds may be added, so a `match` needs a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackoffKind {
    /// The same pause every time: `initial`.
    Constant,
    /// A pause growing by `step` each time, capped at `max`.
    Linear,
    /// A pause multiplied by `multiplier` each time, capped at `max`.
    Exponential,
    /// "Decorrelated jitter": each pause drawn between `initial` and three times
    /// the previous one, capped at `max`.
    Decorrelated,
    /// gRPC's retry backoff (gRFC A6): `initial` first, then
    /// `min(max, initial · multiplier^(n − 1))`; see the [module docs](self).
    Grpc,
}

impl BackoffKind {
    /// The jitter a backoff of this kind gets unless one is set: none for
    /// constant and linear, full for exponential, decorrelated for decorrelated.
    #[must_use]
    pub const fn default_jitter(self) -> Jitter {
        match self {
            Self::Constant | Self::Linear => Jitter::None,
            Self::Exponential => Jitter::Full,
            Self::Decorrelated => Jitter::Decorrelated,
            Self::Grpc => Jitter::Proportional(0.2),
        }
    }
}

/// Randomisation applied to the base pause. See the [module docs](self).
/// More jitters may be added, so a `match` needs a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
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

/// A backoff: a [`BackoffKind`], its parameters and a [`Jitter`].
/// `const`-constructible; every parameter has a `const` setter, so a shared
/// backoff can be adjusted one parameter at a time.
///
/// ```
/// use std::time::Duration;
/// use retries::{Backoff, Jitter};
///
/// const B: Backoff = Backoff::exponential(Duration::from_millis(100), 2.0, Duration::from_secs(1))
///     .with_jitter(Jitter::None);
/// let prev = Duration::ZERO;
/// assert_eq!(B.delay(1, prev), Duration::from_millis(100));
/// assert_eq!(B.delay(3, prev), Duration::from_millis(400));
/// assert_eq!(B.delay(60, prev), Duration::from_secs(1)); // capped, no overflow
/// // Only the jitter changes; kind, first pause and cap are kept:
/// let full = B.with_jitter(Jitter::Full);
/// assert_eq!((full.kind(), full.initial(), full.max()), (B.kind(), B.initial(), B.max()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    kind: BackoffKind,
    initial: Duration,
    max: Duration,
    /// The growth factor of an exponential backoff (kept for the other kinds).
    multiplier: f64,
    /// The increment of a linear backoff (kept for the other kinds); `None`:
    /// the first pause.
    step: Option<Duration>,
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

    const fn of(kind: BackoffKind, initial: Duration, max: Duration) -> Self {
        Self {
            kind,
            initial,
            max,
            multiplier: 2.0,
            step: None,
            jitter: kind.default_jitter(),
        }
    }

    /// The same pause every time, without jitter.
    #[must_use]
    pub const fn constant(delay: Duration) -> Self {
        Self::of(BackoffKind::Constant, delay, delay)
    }

    /// `initial`, `initial + step`, … capped at `max`, without jitter.
    #[must_use]
    pub const fn linear(initial: Duration, step: Duration, max: Duration) -> Self {
        Self::of(BackoffKind::Linear, initial, max).with_step(step)
    }

    /// `initial · multiplier^(n−1)` capped at `max`, with full jitter.
    #[must_use]
    pub const fn exponential(initial: Duration, multiplier: f64, max: Duration) -> Self {
        Self::of(BackoffKind::Exponential, initial, max).with_multiplier(multiplier)
    }

    /// gRPC's retry backoff as gRFC A6 states it, from a service config's
    /// `initialBackoff`, `backoffMultiplier` and `maxBackoff`, with jitter
    /// `random(0.8, 1.2)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use retries::Backoff;
    /// let ms = Duration::from_millis;
    /// let b = Backoff::grpc(ms(100), 2.0, ms(300));
    /// let prev = Duration::ZERO;
    /// assert_eq!((b.delay_at(1, prev, 0.0), b.delay_at(1, prev, 1.0)), (ms(80), ms(120)));
    /// assert_eq!(b.delay_at(3, prev, 1.0), ms(360)); // capped at 300, then jittered
    /// ```
    #[must_use]
    pub const fn grpc(initial: Duration, multiplier: f64, max: Duration) -> Self {
        Self::of(BackoffKind::Grpc, initial, max).with_multiplier(multiplier)
    }

    /// Decorrelated jitter between `initial` and `max`.
    #[must_use]
    pub const fn decorrelated(initial: Duration, max: Duration) -> Self {
        Self::of(BackoffKind::Decorrelated, initial, max)
    }

    /// The same parameters under another kind, with that kind's
    /// [default jitter](BackoffKind::default_jitter) (set a jitter after this
    /// call to override it). A constant backoff pauses `initial` every time.
    #[must_use]
    pub const fn with_kind(mut self, kind: BackoffKind) -> Self {
        self.kind = kind;
        self.jitter = kind.default_jitter();
        self
    }

    /// The same backoff with another jitter.
    #[must_use]
    pub const fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The same backoff with another first pause (for a constant backoff, the
    /// pause; its cap follows).
    #[must_use]
    pub const fn with_initial(mut self, initial: Duration) -> Self {
        self.initial = initial;
        if matches!(self.kind, BackoffKind::Constant) {
            self.max = initial;
        }
        self
    }

    /// The same backoff with another cap (ignored by a constant backoff).
    #[must_use]
    pub const fn with_max(mut self, max: Duration) -> Self {
        self.max = max;
        self
    }

    /// The same backoff with another growth factor (used by the exponential
    /// kind only).
    #[must_use]
    pub const fn with_multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// The same backoff with another increment (used by the linear kind only).
    #[must_use]
    pub const fn with_step(mut self, step: Duration) -> Self {
        self.step = Some(step);
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
        self.initial
    }

    /// The cap (before jitter); for a constant backoff, its pause.
    #[must_use]
    pub const fn max(&self) -> Duration {
        match self.kind {
            BackoffKind::Constant => self.initial,
            _ => self.max,
        }
    }

    /// The growth factor of the exponential kind.
    #[must_use]
    pub const fn multiplier(&self) -> f64 {
        self.multiplier
    }

    /// The increment of the linear kind (unless set, the first pause).
    #[must_use]
    pub const fn step(&self) -> Duration {
        match self.step {
            Some(step) => step,
            None => self.initial,
        }
    }

    /// Check the parameters: multiplier finite and at least 1 (exponential)
    /// or above 0 (grpc), jitter factor in `[0, 1]`, cap not below the first
    /// pause (except for the grpc kind, whose first pause is not capped).
    pub const fn validate(&self) -> Result<(), PolicyError> {
        if matches!(self.kind, BackoffKind::Exponential)
            && !(self.multiplier >= 1.0 && self.multiplier.is_finite())
        {
            return Err(PolicyError::Multiplier);
        }
        if matches!(self.kind, BackoffKind::Grpc) {
            if !(self.multiplier > 0.0 && self.multiplier.is_finite()) {
                return Err(PolicyError::Multiplier);
            }
            if let Jitter::Proportional(f) = self.jitter
                && !(f >= 0.0 && f <= 1.0)
            {
                return Err(PolicyError::JitterFactor);
            }
            return Ok(());
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
    #[inline]
    pub fn base(&self, n: u32) -> Duration {
        let k = n.saturating_sub(1);
        let (initial, max) = (self.initial, self.max());
        match self.kind {
            BackoffKind::Constant => initial,
            BackoffKind::Linear => {
                let grown = self
                    .step()
                    .checked_mul(k)
                    .and_then(|s| initial.checked_add(s))
                    .unwrap_or(Duration::MAX);
                grown.min(max)
            }
            BackoffKind::Exponential => grow(initial, self.multiplier, k, max),
            BackoffKind::Decorrelated => grow(initial, 3.0, k, max),
            BackoffKind::Grpc if k == 0 => initial,
            BackoffKind::Grpc => scale(initial, self.multiplier, k).min(max),
        }
    }

    /// The pause for pause number `n` (1-based) after jitter, given the previous
    /// pause actually taken (`Duration::ZERO` for none), drawing the jitter
    /// from the thread's random generator.
    #[must_use]
    #[inline]
    pub fn delay(&self, n: u32, prev: Duration) -> Duration {
        match self.jitter {
            // Nothing to draw.
            Jitter::None => self.base(n),
            _ => self.delay_at(n, prev, rand::rng().random()),
        }
    }

    /// The pause for pause number `n` after jitter, with the random draw given
    /// as `u` in `[0, 1]` (clamped; NaN reads as 0): `u = 0` gives the smallest
    /// pause the jitter allows, `u = 1` the largest. For exact tests.
    ///
    /// ```
    /// use std::time::Duration;
    /// use retries::{Backoff, Jitter};
    /// let b = Backoff::constant(Duration::from_millis(100)).with_jitter(Jitter::Proportional(0.2));
    /// assert_eq!(b.delay_at(1, Duration::ZERO, 0.0), Duration::from_millis(80));
    /// assert_eq!(b.delay_at(1, Duration::ZERO, 1.0), Duration::from_millis(120));
    /// ```
    #[must_use]
    pub fn delay_at(&self, n: u32, prev: Duration, u: f64) -> Duration {
        let u = if u.is_nan() { 0.0 } else { u.clamp(0.0, 1.0) };
        let d = self.base(n);
        match self.jitter {
            Jitter::None => d,
            Jitter::Full => between(u, Duration::ZERO, d),
            Jitter::Equal => {
                let half = d / 2;
                half + between(u, Duration::ZERO, d.saturating_sub(half))
            }
            Jitter::Proportional(f) => {
                let f = if f.is_nan() { 0.0 } else { f.clamp(0.0, 1.0) };
                from_nanos_f64(nanos(d) as f64 * (1.0 - f + 2.0 * f * u))
            }
            Jitter::Decorrelated => {
                let (lo, cap) = (self.initial(), self.max());
                let prev = if prev.is_zero() { lo } else { prev };
                let hi = prev.checked_mul(3).unwrap_or(Duration::MAX).max(lo);
                between(u, lo, hi).min(cap)
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
        let (initial, max) = (self.initial, self.max());
        match self.kind {
            BackoffKind::Constant => write!(f, "constant {initial:?}")?,
            BackoffKind::Linear => write!(f, "linear {initial:?} +{:?} ≤{max:?}", self.step())?,
            BackoffKind::Exponential => {
                write!(f, "exponential {initial:?} ×{} ≤{max:?}", self.multiplier)?;
            }
            BackoffKind::Decorrelated => write!(f, "decorrelated {initial:?} ≤{max:?}")?,
            BackoffKind::Grpc => write!(f, "grpc {initial:?} ×{} ≤{max:?}", self.multiplier)?,
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

/// `initial · m^k` for any positive finite `m` (shrinking below 1), saturating,
/// never NaN; a multiplier that is not a positive finite number acts as 1.
fn scale(initial: Duration, m: f64, k: u32) -> Duration {
    let m = if m.is_finite() && m > 0.0 { m } else { 1.0 };
    let exp = i32::try_from(k).unwrap_or(i32::MAX);
    from_nanos_f64(nanos(initial) as f64 * m.powi(exp))
}

/// The point `u` of the way from `lo` to `hi` (`u` in `[0, 1]`), to the nanosecond.
fn between(u: f64, lo: Duration, hi: Duration) -> Duration {
    let (lo, hi) = (nanos(lo), nanos(hi));
    if hi <= lo {
        return Duration::from_nanos(lo);
    }
    let span = (hi - lo) as f64 * u;
    Duration::from_nanos(lo.saturating_add(span as u64).min(hi))
}

#[cfg(test)]
#[allow(clippy::many_single_char_names)]
mod tests {
    use super::*;

    /// A fixed sequence of draws spread over [0, 1].
    fn draws() -> impl Iterator<Item = f64> {
        (0..=2000).map(|i| f64::from(i) / 2000.0)
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn kinds_without_jitter() {
        let z = Duration::ZERO;
        let c = Backoff::constant(50 * MS);
        assert_eq!(c.delay(7, z), 50 * MS);
        let l = Backoff::linear(10 * MS, 5 * MS, 22 * MS);
        let got: Vec<_> = (1..=4).map(|n| l.delay(n, z)).collect();
        assert_eq!(got, [10 * MS, 15 * MS, 20 * MS, 22 * MS]);
        let e = Backoff::exponential(100 * MS, 2.0, 1000 * MS).with_jitter(Jitter::None);
        let got: Vec<_> = (1..=6).map(|n| e.delay(n, z)).collect();
        assert_eq!(
            got,
            [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1000 * MS, 1000 * MS]
        );
    }

    #[test]
    fn no_overflow_anywhere() {
        let huge = Duration::MAX;
        for b in [
            Backoff::exponential(huge, 1e300, huge),
            Backoff::exponential(MS, f64::MAX, huge).with_jitter(Jitter::Proportional(1.0)),
            Backoff::linear(huge, huge, huge).with_jitter(Jitter::Equal),
            Backoff::decorrelated(huge, huge),
            Backoff::exponential(Duration::ZERO, 10.0, huge),
        ] {
            for n in [0, 1, 2, 63, 64, 1000, u32::MAX] {
                for u in [0.0, 0.5, 1.0, f64::NAN] {
                    let d = b.delay_at(n, huge, u);
                    assert!(d <= huge, "{b}: {d:?}");
                }
            }
        }
    }

    #[test]
    fn jitter_bounds() {
        let base = Backoff::constant(100 * MS);
        for u in draws() {
            let full = base.with_jitter(Jitter::Full).delay_at(1, MS, u);
            assert!(full <= 100 * MS);
            let eq = base.with_jitter(Jitter::Equal).delay_at(1, MS, u);
            assert!(eq >= 50 * MS && eq <= 100 * MS);
            let p = base
                .with_jitter(Jitter::Proportional(0.2))
                .delay_at(1, MS, u);
            assert!(p >= 80 * MS && p <= 120 * MS, "{p:?}");
            let d = Backoff::decorrelated(10 * MS, 500 * MS).delay_at(1, 100 * MS, u);
            assert!(d >= 10 * MS && d <= 300 * MS, "{d:?}");
            let d = Backoff::decorrelated(10 * MS, 500 * MS).delay_at(1, 400 * MS, u);
            assert!(d >= 10 * MS && d <= 500 * MS, "{d:?}");
        }
        // The ends of each range are reached exactly.
        let full = base.with_jitter(Jitter::Full);
        assert_eq!(
            (full.delay_at(1, MS, 0.0), full.delay_at(1, MS, 1.0)),
            (Duration::ZERO, 100 * MS)
        );
        let eq = base.with_jitter(Jitter::Equal);
        assert_eq!(
            (eq.delay_at(1, MS, 0.0), eq.delay_at(1, MS, 1.0)),
            (50 * MS, 100 * MS)
        );
    }

    #[test]
    fn setters_change_one_parameter() {
        let b = Backoff::DEFAULT.with_jitter(Jitter::None);
        assert_eq!(b.kind(), BackoffKind::Exponential);
        assert_eq!(
            (b.initial(), b.max(), b.multiplier()),
            (100 * MS, 1000 * MS, 2.0)
        );
        let c = b.with_kind(BackoffKind::Constant);
        assert_eq!(
            (c.jitter(), c.delay(5, Duration::ZERO)),
            (Jitter::None, 100 * MS)
        );
        let l = Backoff::DEFAULT
            .with_kind(BackoffKind::Linear)
            .with_step(50 * MS);
        assert_eq!(l.delay(3, Duration::ZERO), 200 * MS);
        let m = b
            .with_multiplier(3.0)
            .with_initial(10 * MS)
            .with_max(50 * MS);
        assert_eq!(m.delay(2, Duration::ZERO), 30 * MS);
        assert_eq!(m.delay(3, Duration::ZERO), 50 * MS);
    }

    #[test]
    fn grpc_backoff_as_grfc_a6_states_it() {
        let b = Backoff::grpc(100 * MS, 2.0, 300 * MS).with_jitter(Jitter::None);
        let got: Vec<_> = (1..=5).map(|n| b.delay(n, Duration::ZERO)).collect();
        assert_eq!(got, [100 * MS, 200 * MS, 300 * MS, 300 * MS, 300 * MS]);
        // The first pause is not capped; later ones are.
        let b = Backoff::grpc(500 * MS, 2.0, 300 * MS).with_jitter(Jitter::None);
        assert_eq!(
            (b.delay(1, Duration::ZERO), b.delay(2, Duration::ZERO)),
            (500 * MS, 300 * MS)
        );
        // A multiplier below 1 shrinks the pauses.
        let b = Backoff::grpc(400 * MS, 0.5, 1000 * MS).with_jitter(Jitter::None);
        let got: Vec<_> = (1..=3).map(|n| b.delay(n, Duration::ZERO)).collect();
        assert_eq!(got, [400 * MS, 200 * MS, 100 * MS]);
        // Jitter ±20 % after the cap.
        let b = Backoff::grpc(100 * MS, 2.0, 300 * MS);
        assert_eq!(b.jitter(), Jitter::Proportional(0.2));
        assert_eq!(
            (b.delay_at(9, MS, 0.0), b.delay_at(9, MS, 1.0)),
            (240 * MS, 360 * MS)
        );
        assert_eq!(b.validate(), Ok(()));
        assert_eq!(
            Backoff::grpc(MS, 0.0, MS).validate(),
            Err(PolicyError::Multiplier)
        );
        assert_eq!(
            Backoff::grpc(MS, f64::NAN, MS).validate(),
            Err(PolicyError::Multiplier)
        );
        for n in [0, 1, 64, u32::MAX] {
            let _ = Backoff::grpc(Duration::MAX, 1e300, Duration::MAX).delay_at(n, MS, 1.0);
            let _ = Backoff::grpc(MS, 1e-300, Duration::MAX).delay_at(n, MS, 0.0);
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
