//! The rules of a switch: which requests a fault applies to ([`Rule`],
//! by name pattern and rate) and the builder that validates them
//! ([`ChaosBuilder`]).

#[allow(clippy::wildcard_imports)]
use super::*;

/// One scope pattern: an optional method and a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pattern {
    method: Option<String>,
    prefix: String,
}

impl Pattern {
    fn parse(rule: usize, text: &str) -> Result<Self, ChaosError> {
        let bad = |why| ChaosError::Pattern {
            rule,
            pattern: text.to_string(),
            why,
        };
        let mut words = text.split(' ');
        let (method, prefix) = match (words.next(), words.next(), words.next()) {
            (Some(p), None, _) => (None, p),
            (Some(m), Some(p), None) => (Some(m), p),
            _ => return Err(bad("at most one space, between the method and the prefix")),
        };
        if prefix.is_empty() {
            return Err(bad("an empty prefix"));
        }
        if let Some(m) = method
            && (m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic()))
        {
            return Err(bad("a method is letters only, such as POST"));
        }
        Ok(Self {
            method: method.map(str::to_ascii_uppercase),
            prefix: prefix.to_string(),
        })
    }

    pub(crate) fn matches(&self, method: Option<&str>, path: &str) -> bool {
        let method_ok = match (&self.method, method) {
            (None, _) => true,
            (Some(want), Some(got)) => want.eq_ignore_ascii_case(got),
            (Some(_), None) => false,
        };
        method_ok && path.starts_with(self.prefix.as_str())
    }
}

/// A fault, how often, and where: one rule of a [`Chaos`].
#[derive(Debug, Clone)]
pub struct Rule {
    fault: Fault,
    rate: f64,
    only: Vec<String>,
}

impl Rule {
    /// `fault` on every request in scope (rate 1, every request).
    #[must_use]
    pub const fn new(fault: Fault) -> Self {
        Self {
            fault,
            rate: 1.0,
            only: Vec::new(),
        }
    }

    /// The share of requests it applies to, from 0 to 1 (checked by
    /// [`ChaosBuilder::build`]).
    #[must_use]
    pub const fn rate(mut self, rate: f64) -> Self {
        self.rate = rate;
        self
    }

    /// Only requests matching one of `patterns` (`"POST /charges"`,
    /// `"/payments.Payments/Charge"`, a name given to [`Chaos::around`]):
    /// see the [module docs](crate#rates-scopes-the-switch).
    #[must_use]
    pub fn only<I, P>(mut self, patterns: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: AsRef<str>,
    {
        self.only
            .extend(patterns.into_iter().map(|p| p.as_ref().to_owned()));
        self
    }
}

/// Builds a [`Chaos`]: [`Chaos::builder`].
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct ChaosBuilder {
    seed: u64,
    rules: Vec<Rule>,
    disabled: bool,
}

impl ChaosBuilder {
    /// The seed of the random source (default 0).
    pub const fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Add a rule.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Start switched off: nothing is injected until
    /// [`Chaos::set_enabled`]`(true)`.
    pub const fn start_disabled(mut self) -> Self {
        self.disabled = true;
        self
    }

    /// Check every rule: rates from 0 to 1, well-formed patterns.
    pub fn build(self) -> Result<Chaos, ChaosError> {
        let mut rules = Vec::with_capacity(self.rules.len());
        for (i, rule) in self.rules.into_iter().enumerate() {
            let ppm = ppm(i, rule.fault.kind(), rule.rate)?;
            if let Fault::FailAfter {
                http_status,
                grpc_code,
            } = rule.fault
                && (!(100..=599).contains(&http_status) || !(1..=16).contains(&grpc_code))
            {
                return Err(ChaosError::Status {
                    rule: i,
                    http_status,
                    grpc_code,
                });
            }
            let scope = rule
                .only
                .iter()
                .map(|p| Pattern::parse(i, p))
                .collect::<Result<Vec<_>, _>>()?;
            rules.push(Live {
                fault: rule.fault,
                ppm: AtomicU32::new(ppm),
                scope,
                injected: AtomicU64::new(0),
                observed: AtomicU64::new(0),
            });
        }
        Ok(Chaos {
            inner: Arc::new(Inner {
                seed: self.seed,
                enabled: AtomicBool::new(!self.disabled),
                requests: AtomicU64::new(0),
                rules: rules.into_boxed_slice(),
                effects: AtomicU64::new(0),
                keys: Mutex::new(HashSet::new()),
            }),
        })
    }
}

/// A rate as parts per million.
pub(crate) fn ppm(rule: usize, kind: FaultKind, rate: f64) -> Result<u32, ChaosError> {
    if !(0.0..=1.0).contains(&rate) {
        return Err(ChaosError::Rate { rule, kind, rate });
    }
    Ok((rate * 1_000_000.0).round() as u32)
}
