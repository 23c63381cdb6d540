//! gRPC service config (feature `service-config`, first named `grpc-config`): the `methodConfig` entries
//! with their `timeout`, `retryPolicy` and `hedgingPolicy`, and
//! `retryThrottling`, parsed and validated as gRFC A6 ("gRPC Retry Design")
//! says, so the JSON a polyglot team gives its Go, Java and C++ clients
//! drives the Rust one too (through [`RetryLayer::service_config`]).
//!
//! ```
//! use retries_tower::service_config::ServiceConfig;
//!
//! let config = ServiceConfig::from_json(r#"{
//!   "methodConfig": [{
//!     "name": [{"service": "payments.Payments", "method": "GetCharge"}],
//!     "timeout": "2s",
//!     "retryPolicy": {
//!       "maxAttempts": 4,
//!       "initialBackoff": "0.1s",
//!       "maxBackoff": "1s",
//!       "backoffMultiplier": 2,
//!       "retryableStatusCodes": ["UNAVAILABLE"]
//!     }
//!   }],
//!   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
//! }"#).unwrap();
//! let m = config.method("/payments.Payments/GetCharge").unwrap();
//! assert_eq!(m.retry_policy().unwrap().max_attempts(), 4);
//! assert!(config.method("/payments.Payments/Charge").is_none());
//! ```
//!
//! # Validation (gRFC A6)
//!
//! * `timeout`: a proto3 JSON duration greater than zero (A6 leaves zero
//!   undefined; as a deadline it could never be met, so it is an error).
//! * `retryPolicy`: `maxAttempts` an integer greater than 1 (above 5 it is
//!   taken as 5, not an error); `initialBackoff` and `maxBackoff` proto3
//!   JSON durations (`"0.1s"`) greater than zero; `backoffMultiplier` a
//!   number greater than zero; `retryableStatusCodes` a non-empty array of
//!   codes, as integers or case-insensitive names (`14`, `"UNAVAILABLE"`,
//!   `"unavailable"`).
//! * `hedgingPolicy`: `maxAttempts` as above; `hedgingDelay` an optional
//!   duration; `nonFatalStatusCodes` an optional array of codes.
//! * A method has a `retryPolicy` or a `hedgingPolicy`, not both.
//! * `retryThrottling`: `maxTokens` an integer in (0, 1000], `tokenRatio` a
//!   number greater than 0; decimals past the third are ignored (0.5466 is
//!   0.546), so a ratio below 0.001 is an error.
//! * Names: each `name` entry has a `service`, and may have a `method`; an
//!   entry with neither is the default for every method. A name given twice
//!   is an error.
//!
//! Every error is a [`ConfigError`] naming the JSON path of the value at
//! fault (`methodConfig[2].retryPolicy.maxAttempts`). Fields A6 does not
//! concern (`waitForReady`, `loadBalancingPolicy`, …) are ignored. Field
//! names match without regard to case, as grpc-go reads them (its examples
//! write `"MaxAttempts"`).
//!
//! Durations follow proto3 JSON: a decimal number of seconds with an `s`
//! (`"1s"`, `"0.25s"`, up to nine decimals); a fraction without its leading
//! zero (`".01s"`, as in grpc-go's examples) is accepted too.
//!
//! [`RetryLayer::service_config`]: crate::RetryLayer::service_config

use std::fmt;
use std::time::Duration;

use serde_json::Value;
use tonic::Code;

use retries_core::backoff::Backoff;
use retries_core::budget::TokenBucket;
use retries_core::policy::Policy;

/// A value of a service config that A6 does not accept, and where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct ConfigError {
    path: String,
    problem: String,
}

impl ConfigError {
    fn new(path: &str, problem: impl Into<String>) -> Self {
        Self {
            path: path.to_string(),
            problem: problem.into(),
        }
    }

    /// The JSON path of the value at fault (`methodConfig[0].timeout`; empty
    /// for the document itself).
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong with it.
    #[must_use]
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

/// A set of gRPC status codes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Codes(u32);

impl Codes {
    /// `true` when `code` is in the set.
    #[must_use]
    pub fn contains(self, code: Code) -> bool {
        let bit = code as i32;
        (0..32).contains(&bit) && self.0 & (1 << bit) != 0
    }

    /// `true` for the empty set.
    #[must_use]
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    fn insert(&mut self, code: Code) {
        self.0 |= 1 << (code as i32);
    }
}

/// A method's `retryPolicy`.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
    multiplier: f64,
    retryable: Codes,
}

impl RetryPolicy {
    /// `maxAttempts`, at most 5.
    #[must_use]
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The backoff A6 states: `Backoff::grpc(initialBackoff,
    /// backoffMultiplier, maxBackoff)`.
    #[must_use]
    pub fn backoff(&self) -> Backoff {
        Backoff::grpc(self.initial_backoff, self.multiplier, self.max_backoff)
    }

    /// `retryableStatusCodes`.
    #[must_use]
    pub fn retryable_codes(&self) -> Codes {
        self.retryable
    }
}

/// A method's `hedgingPolicy`; the layer hedges by it (see
/// [`RetryLayer::service_config`](crate::RetryLayer::service_config)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HedgingPolicy {
    max_attempts: u32,
    delay: Duration,
    non_fatal: Codes,
}

impl HedgingPolicy {
    /// `maxAttempts`, at most 5.
    #[must_use]
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// `hedgingDelay` (zero when not given).
    #[must_use]
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// `nonFatalStatusCodes`.
    #[must_use]
    pub fn non_fatal_codes(&self) -> Codes {
        self.non_fatal
    }
}

/// One `name` entry of a method config.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Name {
    /// Empty for the default entry.
    service: String,
    method: Option<String>,
}

/// One `methodConfig` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodConfig {
    names: Vec<Name>,
    timeout: Option<Duration>,
    retry: Option<RetryPolicy>,
    hedging: Option<HedgingPolicy>,
}

impl MethodConfig {
    /// `timeout`: the default deadline of the method's calls.
    #[must_use]
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// `retryPolicy`.
    #[must_use]
    pub fn retry_policy(&self) -> Option<&RetryPolicy> {
        self.retry.as_ref()
    }

    /// `hedgingPolicy`.
    #[must_use]
    pub fn hedging_policy(&self) -> Option<&HedgingPolicy> {
        self.hedging.as_ref()
    }

    /// The [`Policy`] of this method's calls, from `base`: `timeout` as the
    /// deadline when given, and with a `retryPolicy` its attempts and A6's
    /// backoff; without one, a single attempt (A6: not retried).
    #[must_use]
    pub fn policy(&self, base: Policy) -> Policy {
        let mut p = base;
        if let Some(t) = self.timeout {
            p = p.with_deadline(t);
        }
        match &self.retry {
            Some(r) => p
                .with_max_attempts(r.max_attempts)
                .with_backoff(r.backoff()),
            None => p.with_max_attempts(1),
        }
    }
}

/// `retryThrottling`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throttling {
    max_tokens: u32,
    token_ratio: f64,
}

impl Throttling {
    /// The token bucket this throttling describes (one per channel).
    #[must_use]
    pub fn bucket(&self) -> TokenBucket {
        TokenBucket::new(self.max_tokens, self.token_ratio)
    }

    /// `maxTokens`.
    #[must_use]
    pub fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// `tokenRatio`, as given.
    #[must_use]
    pub fn token_ratio(&self) -> f64 {
        self.token_ratio
    }
}

/// A parsed, validated service config.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ServiceConfig {
    methods: Vec<MethodConfig>,
    throttling: Option<Throttling>,
}

impl ServiceConfig {
    /// Parse and validate `json` (see the [module docs](self)).
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        let doc: Value = serde_json::from_str(json)
            .map_err(|e| ConfigError::new("", format!("not valid JSON: {e}")))?;
        Self::from_value(&doc)
    }

    /// [`from_json`](Self::from_json) for a JSON value already parsed.
    pub fn from_value(doc: &Value) -> Result<Self, ConfigError> {
        let doc = doc
            .as_object()
            .ok_or_else(|| ConfigError::new("", "a service config is a JSON object"))?;
        let mut config = Self::default();
        if let Some(list) = field(doc, "methodConfig") {
            let list = list
                .as_array()
                .ok_or_else(|| ConfigError::new("methodConfig", "must be an array"))?;
            for (i, entry) in list.iter().enumerate() {
                let path = format!("methodConfig[{i}]");
                let m = method_config(&path, entry)?;
                for (j, name) in m.names.iter().enumerate() {
                    if config.methods.iter().any(|o| o.names.contains(name)) {
                        return Err(ConfigError::new(
                            &format!("{path}.name[{j}]"),
                            "this name is already given by an earlier methodConfig",
                        ));
                    }
                }
                config.methods.push(m);
            }
        }
        if let Some(t) = field(doc, "retryThrottling") {
            config.throttling = Some(throttling("retryThrottling", t)?);
        }
        Ok(config)
    }

    /// The method config for a call to `path` (`/package.Service/Method`):
    /// the entry naming the method, else the one naming its service, else
    /// the default entry.
    #[must_use]
    pub fn method(&self, path: &str) -> Option<&MethodConfig> {
        let (service, method) = path.strip_prefix('/')?.split_once('/')?;
        let find =
            |pred: &dyn Fn(&Name) -> bool| self.methods.iter().find(|m| m.names.iter().any(pred));
        find(&|n| n.service == service && n.method.as_deref() == Some(method))
            .or_else(|| find(&|n| n.service == service && n.method.is_none()))
            .or_else(|| find(&|n| n.service.is_empty()))
    }

    /// `retryThrottling`, if given.
    #[must_use]
    pub fn throttling(&self) -> Option<Throttling> {
        self.throttling
    }
}

fn method_config(path: &str, v: &Value) -> Result<MethodConfig, ConfigError> {
    let o = v
        .as_object()
        .ok_or_else(|| ConfigError::new(path, "a methodConfig entry is an object"))?;
    let names = match field(o, "name") {
        None => Vec::new(),
        Some(n) => {
            let list = n
                .as_array()
                .ok_or_else(|| ConfigError::new(&format!("{path}.name"), "must be an array"))?;
            list.iter()
                .enumerate()
                .map(|(j, n)| name(&format!("{path}.name[{j}]"), n))
                .collect::<Result<_, _>>()?
        }
    };
    let timeout = field(o, "timeout")
        // A zero timeout would be a deadline no call can meet, and a
        // policy that fails its own validation: an error here.
        .map(|t| duration(&format!("{path}.timeout"), t, true))
        .transpose()?;
    let retry = field(o, "retryPolicy")
        .map(|r| retry_policy(&format!("{path}.retryPolicy"), r))
        .transpose()?;
    let hedging = field(o, "hedgingPolicy")
        .map(|h| hedging_policy(&format!("{path}.hedgingPolicy"), h))
        .transpose()?;
    if retry.is_some() && hedging.is_some() {
        return Err(ConfigError::new(
            path,
            "a method has a retryPolicy or a hedgingPolicy, not both",
        ));
    }
    Ok(MethodConfig {
        names,
        timeout,
        retry,
        hedging,
    })
}

fn name(path: &str, v: &Value) -> Result<Name, ConfigError> {
    let o = v
        .as_object()
        .ok_or_else(|| ConfigError::new(path, "a name is an object"))?;
    let text = |key: &str| -> Result<Option<String>, ConfigError> {
        match field(o, key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ConfigError::new(
                &format!("{path}.{key}"),
                "must be a string",
            )),
        }
    };
    let service = text("service")?.unwrap_or_default();
    let method = text("method")?.filter(|m| !m.is_empty());
    if service.is_empty() && method.is_some() {
        return Err(ConfigError::new(
            &format!("{path}.method"),
            "a method needs its service",
        ));
    }
    Ok(Name { service, method })
}

/// The value of `key` in `o`, the key matched without regard to ASCII case
/// (grpc-go reads service configs that way, and its examples write
/// `"MaxAttempts"`).
fn field<'a>(o: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a Value> {
    o.get(key).or_else(|| {
        o.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    })
}

fn object<'a>(path: &str, v: &'a Value) -> Result<&'a serde_json::Map<String, Value>, ConfigError> {
    v.as_object()
        .ok_or_else(|| ConfigError::new(path, "must be an object"))
}

fn required<'a>(
    path: &str,
    o: &'a serde_json::Map<String, Value>,
    key: &str,
) -> Result<&'a Value, ConfigError> {
    field(o, key).ok_or_else(|| ConfigError::new(&format!("{path}.{key}"), "is required"))
}

fn max_attempts(path: &str, v: &Value) -> Result<u32, ConfigError> {
    match v.as_u64() {
        Some(n) if n > 1 => Ok(u32::try_from(n.min(5)).unwrap_or(5)),
        _ => Err(ConfigError::new(
            path,
            "must be an integer greater than 1 (values above 5 are taken as 5)",
        )),
    }
}

fn retry_policy(path: &str, v: &Value) -> Result<RetryPolicy, ConfigError> {
    let o = object(path, v)?;
    let at = |key: &str| format!("{path}.{key}");
    let max_attempts = max_attempts(&at("maxAttempts"), required(path, o, "maxAttempts")?)?;
    let initial_backoff = duration(
        &at("initialBackoff"),
        required(path, o, "initialBackoff")?,
        true,
    )?;
    let max_backoff = duration(&at("maxBackoff"), required(path, o, "maxBackoff")?, true)?;
    let multiplier = match required(path, o, "backoffMultiplier")?.as_f64() {
        Some(m) if m > 0.0 && m.is_finite() => m,
        _ => {
            return Err(ConfigError::new(
                &at("backoffMultiplier"),
                "must be a number greater than 0",
            ));
        }
    };
    let retryable = codes(
        &at("retryableStatusCodes"),
        required(path, o, "retryableStatusCodes")?,
    )?;
    if retryable.is_empty() {
        return Err(ConfigError::new(
            &at("retryableStatusCodes"),
            "must not be empty",
        ));
    }
    Ok(RetryPolicy {
        max_attempts,
        initial_backoff,
        max_backoff,
        multiplier,
        retryable,
    })
}

fn hedging_policy(path: &str, v: &Value) -> Result<HedgingPolicy, ConfigError> {
    let o = object(path, v)?;
    let at = |key: &str| format!("{path}.{key}");
    let max_attempts = max_attempts(&at("maxAttempts"), required(path, o, "maxAttempts")?)?;
    let delay = field(o, "hedgingDelay")
        .map(|d| duration(&at("hedgingDelay"), d, false))
        .transpose()?
        .unwrap_or(Duration::ZERO);
    let non_fatal = field(o, "nonFatalStatusCodes")
        .map(|c| codes(&at("nonFatalStatusCodes"), c))
        .transpose()?
        .unwrap_or_default();
    Ok(HedgingPolicy {
        max_attempts,
        delay,
        non_fatal,
    })
}

fn throttling(path: &str, v: &Value) -> Result<Throttling, ConfigError> {
    let o = object(path, v)?;
    let max_tokens = match required(path, o, "maxTokens")?.as_u64() {
        Some(n @ 1..=1000) => n as u32,
        _ => {
            return Err(ConfigError::new(
                &format!("{path}.maxTokens"),
                "must be an integer in (0, 1000]",
            ));
        }
    };
    let token_ratio = match required(path, o, "tokenRatio")?.as_f64() {
        Some(r) if r.is_finite() && r > 0.0 => r,
        _ => {
            return Err(ConfigError::new(
                &format!("{path}.tokenRatio"),
                "must be a number greater than 0",
            ));
        }
    };
    if TokenBucket::try_new(max_tokens, token_ratio).is_err() {
        return Err(ConfigError::new(
            &format!("{path}.tokenRatio"),
            "is 0 once decimals past the third are dropped: it must be at least 0.001",
        ));
    }
    Ok(Throttling {
        max_tokens,
        token_ratio,
    })
}

/// The codes of a JSON array of integers or case-insensitive names.
fn codes(path: &str, v: &Value) -> Result<Codes, ConfigError> {
    let list = v
        .as_array()
        .ok_or_else(|| ConfigError::new(path, "must be an array of status codes"))?;
    let mut set = Codes::default();
    for (i, c) in list.iter().enumerate() {
        let code = match c {
            Value::Number(n) => n
                .as_u64()
                .filter(|n| *n <= 16)
                .map(|n| Code::from(n as i32)),
            Value::String(s) => code_named(s),
            _ => None,
        }
        .ok_or_else(|| {
            ConfigError::new(
                &format!("{path}[{i}]"),
                format!(
                    "`{c}` is not a gRPC status code (0 to 16, or a name such as \"UNAVAILABLE\")"
                ),
            )
        })?;
        set.insert(code);
    }
    Ok(set)
}

fn code_named(name: &str) -> Option<Code> {
    const NAMES: [(&str, Code); 17] = [
        ("OK", Code::Ok),
        ("CANCELLED", Code::Cancelled),
        ("UNKNOWN", Code::Unknown),
        ("INVALID_ARGUMENT", Code::InvalidArgument),
        ("DEADLINE_EXCEEDED", Code::DeadlineExceeded),
        ("NOT_FOUND", Code::NotFound),
        ("ALREADY_EXISTS", Code::AlreadyExists),
        ("PERMISSION_DENIED", Code::PermissionDenied),
        ("RESOURCE_EXHAUSTED", Code::ResourceExhausted),
        ("FAILED_PRECONDITION", Code::FailedPrecondition),
        ("ABORTED", Code::Aborted),
        ("OUT_OF_RANGE", Code::OutOfRange),
        ("UNIMPLEMENTED", Code::Unimplemented),
        ("INTERNAL", Code::Internal),
        ("UNAVAILABLE", Code::Unavailable),
        ("DATA_LOSS", Code::DataLoss),
        ("UNAUTHENTICATED", Code::Unauthenticated),
    ];
    NAMES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, c)| *c)
}

/// A proto3 JSON duration (`"1.5s"`); `positive`: zero is an error too.
fn duration(path: &str, v: &Value, positive: bool) -> Result<Duration, ConfigError> {
    let bad = |why: &str| {
        ConfigError::new(
            path,
            format!(
                "{why}: a duration is a decimal number of seconds with an `s`, such as \"0.1s\""
            ),
        )
    };
    let text = v.as_str().ok_or_else(|| bad("must be a string"))?;
    let number = text.strip_suffix('s').ok_or_else(|| bad("no `s` suffix"))?;
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty())
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !fraction.bytes().all(|b| b.is_ascii_digit())
        || fraction.len() > 9
        || (number.contains('.') && fraction.is_empty())
    {
        return Err(bad(if number.starts_with('-') {
            "must not be negative"
        } else {
            "malformed"
        }));
    }
    let secs: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad("too long"))?
    };
    let nanos: u32 = format!("{fraction:0<9}")
        .parse()
        .map_err(|_| bad("malformed"))?;
    let d = Duration::new(secs, nanos);
    if positive && d.is_zero() {
        return Err(ConfigError::new(path, "must be greater than 0"));
    }
    Ok(d)
}

impl fmt::Display for Codes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for i in 0..=16 {
            let code = Code::from(i);
            if self.contains(code) {
                if !first {
                    f.write_str(", ")?;
                }
                first = false;
                write!(f, "{code:?}")?;
            }
        }
        Ok(())
    }
}
