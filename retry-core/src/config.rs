//! Policies and budgets from configuration files (feature `config`, first named `serde`): a
//! [`Policy`] and a [`TokenBucket`] deserialize from TOML, JSON, YAML or any
//! serde format, with human durations, and are validated by the same rules
//! as in code ([`Policy::validate`], [`TokenBucket::try_new`]). A bad value
//! is an error that names its field, never a panic.
//!
//! ```
//! # #[derive(serde::Deserialize)] struct Services { inventory: retries::Policy, payments: retries::Policy }
//! let services: Services = toml::from_str(r#"
//!     [inventory]
//!     deadline = "2s"
//!     max_attempts = 4
//!     backoff = { kind = "exponential", initial = "50ms", max = "1s", jitter = "full" }
//!
//!     [payments]
//!     deadline = "5s"
//!     attempt_timeout = "1.5s"
//!     reserve = "200ms"
//! "#).unwrap();
//! assert_eq!(services.inventory.max_attempts(), 4);
//! assert_eq!(services.payments.reserve(), std::time::Duration::from_millis(200));
//! ```
//!
//! # Fields
//!
//! A policy: `deadline` (required), `max_attempts`, `attempt_timeout`,
//! `reserve`, `min_attempt`, and `backoff` with `kind` (`"constant"`,
//! `"linear"`, `"exponential"`, `"decorrelated"`, `"grpc"`), `initial`,
//! `max`, `multiplier` and `jitter` (`"none"`, `"full"`, `"equal"`,
//! `"decorrelated"`, or a proportional factor in `[0, 1]`). What is not given
//! keeps [`Policy`]'s default. Unknown fields are errors (a misspelt
//! `max_attemps` is not silently ignored).
//!
//! A token bucket: `max_tokens` (1 to 1000) and `token_ratio` (at least
//! 0.001; digits past the third decimal are ignored, as gRPC does).
//!
//! # Durations
//!
//! A number and a unit, or several (`"250ms"`, `"2s"`, `"1.5s"`, `"1m30s"`);
//! units `ns`, `us`, `ms`, `s`, `m`, `h`. No sign, no unit-less numbers.

use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer};

use crate::backoff::{BackoffKind, Jitter};
use crate::budget::TokenBucket;
use crate::policy::Policy;

/// Why a duration could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a duration: {why} (write e.g. \"250ms\", \"2s\", \"1m30s\")")]
pub struct DurationError {
    text: String,
    why: &'static str,
}

/// Read a human duration (see the [module docs](self)).
///
/// ```
/// use std::time::Duration;
/// use retries::config::parse_duration;
///
/// assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
/// assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
/// assert!(parse_duration("2x").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let err = |why| DurationError {
        text: text.to_string(),
        why,
    };
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(err("it is empty"));
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| err("a number needs a unit"))?;
        let (number, tail) = rest.split_at(digits);
        if number.is_empty() {
            return Err(err("a unit needs a number before it"));
        }
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let nanos_per: f64 = match unit {
            "ns" => 1.0,
            "us" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(err("the unit is not one of ns, us, ms, s, m, h")),
        };
        let value: f64 = number.parse().map_err(|_| err("the number is malformed"))?;
        let nanos = value * nanos_per;
        if !nanos.is_finite() || nanos > 1e18 {
            return Err(err("it is too long"));
        }
        total = total
            .checked_add(Duration::from_nanos(nanos.round() as u64))
            .ok_or_else(|| err("it is too long"))?;
        rest = next;
    }
    Ok(total)
}

/// Deserializers of one field each, whose errors (a value of the wrong
/// type) name the field, whatever the format.
macro_rules! named {
    ($($f:ident: $t:ty = $name:literal),* $(,)?) => {$(
        fn $f<'de, D: Deserializer<'de>>(d: D) -> Result<$t, D::Error> {
            <$t>::deserialize(d).map_err(|e| de::Error::custom(format!("`{}`: {e}", $name)))
        }
    )*};
}

named! {
    deadline: String = "deadline",
    max_attempts: Option<u32> = "max_attempts",
    attempt_timeout: Option<String> = "attempt_timeout",
    reserve: Option<String> = "reserve",
    min_attempt: Option<String> = "min_attempt",
    kind: Option<String> = "backoff.kind",
    initial: Option<String> = "backoff.initial",
    max: Option<String> = "backoff.max",
    multiplier: Option<f64> = "backoff.multiplier",
    jitter: Option<JitterField> = "backoff.jitter",
    max_tokens: u32 = "max_tokens",
    token_ratio: f64 = "token_ratio",
}

/// A policy as written in a file.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFields {
    #[serde(deserialize_with = "deadline")]
    deadline: String,
    #[serde(default, deserialize_with = "max_attempts")]
    max_attempts: Option<u32>,
    #[serde(default, deserialize_with = "attempt_timeout")]
    attempt_timeout: Option<String>,
    #[serde(default, deserialize_with = "reserve")]
    reserve: Option<String>,
    #[serde(default, deserialize_with = "min_attempt")]
    min_attempt: Option<String>,
    #[serde(default)]
    backoff: Option<BackoffFields>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BackoffFields {
    #[serde(default, deserialize_with = "kind")]
    kind: Option<String>,
    #[serde(default, deserialize_with = "initial")]
    initial: Option<String>,
    #[serde(default, deserialize_with = "max")]
    max: Option<String>,
    #[serde(default, deserialize_with = "multiplier")]
    multiplier: Option<f64>,
    #[serde(default, deserialize_with = "jitter")]
    jitter: Option<JitterField>,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum JitterField {
    Named(String),
    Factor(f64),
}

/// A duration field, read with its name in the error.
fn duration_field(name: &str, text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| format!("`{name}`: {e}"))
}

impl PolicyFields {
    fn into_policy(self) -> Result<Policy, String> {
        let mut p = Policy::new(duration_field("deadline", &self.deadline)?);
        if let Some(n) = self.max_attempts {
            p = p.with_max_attempts(n);
        }
        if let Some(t) = &self.attempt_timeout {
            p = p.with_attempt_timeout(duration_field("attempt_timeout", t)?);
        }
        if let Some(r) = &self.reserve {
            p = p.with_reserve(duration_field("reserve", r)?);
        }
        if let Some(m) = &self.min_attempt {
            p = p.with_min_attempt(duration_field("min_attempt", m)?);
        }
        if let Some(b) = self.backoff {
            if let Some(kind) = &b.kind {
                let kind = match kind.as_str() {
                    "constant" => BackoffKind::Constant,
                    "linear" => BackoffKind::Linear,
                    "exponential" => BackoffKind::Exponential,
                    "decorrelated" => BackoffKind::Decorrelated,
                    "grpc" => BackoffKind::Grpc,
                    other => {
                        return Err(format!(
                            "`backoff.kind`: `{other}` is not one of \"constant\", \"linear\", \"exponential\", \"decorrelated\", \"grpc\""
                        ));
                    }
                };
                p = p.with_backoff_kind(kind);
            }
            if let Some(i) = &b.initial {
                p = p.with_initial_backoff(duration_field("backoff.initial", i)?);
            }
            if let Some(m) = &b.max {
                p = p.with_max_backoff(duration_field("backoff.max", m)?);
            }
            if let Some(m) = b.multiplier {
                p = p.with_multiplier(m);
            }
            if let Some(j) = b.jitter {
                let jitter = match j {
                    JitterField::Factor(f) => Jitter::Proportional(f),
                    JitterField::Named(name) => match name.as_str() {
                        "none" => Jitter::None,
                        "full" => Jitter::Full,
                        "equal" => Jitter::Equal,
                        "decorrelated" => Jitter::Decorrelated,
                        other => {
                            return Err(format!(
                                "`backoff.jitter`: `{other}` is not one of \"none\", \"full\", \"equal\", \"decorrelated\" or a factor in [0, 1]"
                            ));
                        }
                    },
                };
                p = p.with_jitter(jitter);
            }
        }
        p.try_validated().map_err(|e| {
            let fields = e.keys().join("`, `");
            format!("invalid policy (`{fields}`): {e}")
        })
    }
}

impl<'de> Deserialize<'de> for Policy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        PolicyFields::deserialize(d)?
            .into_policy()
            .map_err(de::Error::custom)
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BucketFields {
    #[serde(deserialize_with = "max_tokens")]
    max_tokens: u32,
    #[serde(deserialize_with = "token_ratio")]
    token_ratio: f64,
}

impl<'de> Deserialize<'de> for TokenBucket {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let f = BucketFields::deserialize(d)?;
        TokenBucket::try_new(f.max_tokens, f.token_ratio).map_err(|e| {
            let field = match e {
                crate::budget::BudgetError::MaxTokens => "max_tokens",
                _ => "token_ratio",
            };
            de::Error::custom(format!("`{field}`: {e}"))
        })
    }
}
