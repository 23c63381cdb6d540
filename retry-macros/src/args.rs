//! The keys of `#[retryable(...)]`: parsing, duplicate and unknown keys, and the
//! checks that can be made on literals at compile time.

use std::fmt::Write as _;

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{Error, Expr, ExprLit, ExprUnary, Ident, Lit, Path, Token, UnOp};

use crate::duration;

/// Every accepted key, in the order the docs list them.
pub(crate) const KEYS: &[&str] = &[
    "deadline",
    "max_attempts",
    "attempt_timeout",
    "reserve",
    "min_attempt",
    "backoff",
    "initial_backoff",
    "max_backoff",
    "multiplier",
    "jitter",
    "idempotent",
    "reconcile",
    "recover",
    "classify",
    "on_retry",
    "attempt",
    "policy",
    "budget",
    "breaker",
    "nested",
    "crate",
];

/// Keys people reach for from other libraries, with the name used here.
const RENAMED: &[(&str, &str)] = &[
    (
        "timeout",
        "use `deadline` (the whole call) or `attempt_timeout` (one attempt)",
    ),
    ("total_timeout", "use `deadline`"),
    (
        "max_retries",
        "use `max_attempts`, which counts the first attempt too",
    ),
    (
        "retries",
        "use `max_attempts`, which counts the first attempt too",
    ),
    ("attempts", "use `max_attempts`"),
    ("per_attempt_timeout", "use `attempt_timeout`"),
    ("delay", "use `initial_backoff`"),
    ("initial_delay", "use `initial_backoff`"),
    ("max_delay", "use `max_backoff`"),
    ("backoff_multiplier", "use `multiplier`"),
    ("fallback", "use `recover`"),
    ("retry_if", "use `classify`"),
    ("when", "use `classify`"),
    ("idempotency", "use `idempotent`"),
];

/// A value that is either checked at compile time or left to rustc.
pub(crate) enum Value<T> {
    Lit(T, Span),
    Expr(Expr),
}

impl<T> Value<T> {
    pub(crate) fn lit(&self) -> Option<&T> {
        match self {
            Value::Lit(v, _) => Some(v),
            Value::Expr(_) => None,
        }
    }

    pub(crate) fn span(&self) -> Span {
        match self {
            Value::Lit(_, s) => *s,
            Value::Expr(e) => e.span(),
        }
    }
}

/// Backoff kinds that can be named in the attribute.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Constant,
    Linear,
    Exponential,
    Decorrelated,
}

pub(crate) enum BackoffArg {
    Kind(Kind),
    Expr(Expr),
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum JitterLit {
    None,
    Full,
    Equal,
    Decorrelated,
    Proportional(f64),
}

/// `breaker = STATIC` or `breaker(failure_threshold = …, open_for = …, half_open_probes = …)`.
#[allow(clippy::large_enum_variant)] // one per attribute, parsed once
pub(crate) enum BreakerArg {
    Static(Expr),
    Inline {
        threshold: Value<u32>,
        open_for: Value<u64>,
        probes: Option<Value<u32>>,
    },
}

pub(crate) enum BudgetArg {
    Off(Span),
    Expr(Expr),
}

/// The parsed attribute.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) deadline: Option<Value<u64>>,
    pub(crate) max_attempts: Option<Value<u32>>,
    pub(crate) attempt_timeout: Option<Value<u64>>,
    pub(crate) reserve: Option<Value<u64>>,
    pub(crate) min_attempt: Option<Value<u64>>,
    pub(crate) backoff: Option<BackoffArg>,
    pub(crate) initial_backoff: Option<Value<u64>>,
    pub(crate) max_backoff: Option<Value<u64>>,
    pub(crate) multiplier: Option<Value<f64>>,
    pub(crate) jitter: Option<Value<JitterLit>>,
    pub(crate) idempotent: Option<(bool, Span)>,
    pub(crate) reconcile: Option<Expr>,
    pub(crate) recover: Option<Expr>,
    pub(crate) classify: Option<Expr>,
    pub(crate) on_retry: Option<Expr>,
    pub(crate) attempt: Option<Ident>,
    pub(crate) policy: Option<Expr>,
    pub(crate) budget: Option<BudgetArg>,
    pub(crate) breaker: Option<BreakerArg>,
    pub(crate) krate: Option<Path>,
    /// `true` for `nested = "own"`.
    pub(crate) nested_own: Option<bool>,
    /// Every key written, valid or not (so a malformed value is not also
    /// reported as missing).
    pub(crate) seen: Vec<String>,
    /// The attribute did not parse to the end: cross-key checks would only
    /// add noise.
    pub(crate) incomplete: bool,
}

impl Args {
    /// Whether `key` was written, whatever its value.
    pub(crate) fn saw(&self, key: &str) -> bool {
        self.seen.iter().any(|k| k == key)
    }
}

/// Collects errors so that every problem of an attribute is reported at once.
#[derive(Default)]
pub(crate) struct Errors(Option<Error>);

impl Errors {
    pub(crate) fn push(&mut self, e: Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }

    pub(crate) fn at(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.push(Error::new(span, msg));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub(crate) fn into_tokens(self) -> TokenStream {
        self.0.map(|e| e.to_compile_error()).unwrap_or_default()
    }
}

/// Parse the attribute's tokens. Syntax errors end the parse; every other
/// problem is collected in `errors` and the key is skipped.
pub(crate) fn parse(tokens: TokenStream, errors: &mut Errors) -> Args {
    let mut args = Args::default();
    let parser = |input: ParseStream<'_>| -> syn::Result<()> {
        while !input.is_empty() {
            let key = input.call(Ident::parse_any)?;
            if input.peek(syn::token::Paren) {
                let content;
                syn::parenthesized!(content in input);
                let pairs = content.parse_terminated(
                    |p: ParseStream<'_>| {
                        let k = p.call(Ident::parse_any)?;
                        p.parse::<Token![=]>()?;
                        Ok((k, p.parse::<Expr>()?))
                    },
                    Token![,],
                )?;
                args.set_list(&key, pairs.into_iter().collect(), errors);
                if input.is_empty() {
                    break;
                }
                input.parse::<Token![,]>()?;
                continue;
            }
            let value = if input.peek(Token![=]) {
                input.parse::<Token![=]>()?;
                Some(input.parse::<Expr>()?)
            } else {
                None
            };
            args.set(&key, value, errors);
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(())
    };
    if let Err(e) = parser.parse2(tokens) {
        errors.push(e);
        args.incomplete = true;
    }
    args
}

/// Store `value` in `slot`, or report a duplicate at the second occurrence.
fn put<T>(slot: &mut Option<T>, key: &Ident, value: Option<T>, errors: &mut Errors) {
    let Some(value) = value else { return };
    if slot.is_some() {
        errors.at(
            key.span(),
            format_args!("duplicate key `{key}`: each key may be given once"),
        );
    } else {
        *slot = Some(value);
    }
}

impl Args {
    /// The one setter: every key goes through here, so the duplicate check is
    /// written once.
    fn set(&mut self, key: &Ident, value: Option<Expr>, errors: &mut Errors) {
        let value = value.map(peel);
        let name = key.to_string();
        self.seen.push(name.clone());
        // `idempotent` alone is a flag; every other key needs a value.
        if name == "idempotent" {
            let v = match value {
                None => Some((true, key.span())),
                Some(e) => bool_lit(&e, errors),
            };
            return put(&mut self.idempotent, key, v, errors);
        }
        if !KEYS.contains(&name.as_str()) {
            return errors.push(unknown_key(key));
        }
        let Some(value) = value else {
            return errors.at(
                key.span(),
                format_args!("`{name}` needs a value: `{name} = …`"),
            );
        };
        match name.as_str() {
            "deadline" => {
                let v = duration_value(value, errors);
                put(&mut self.deadline, key, v, errors);
            }
            "attempt_timeout" => {
                let v = duration_value(value, errors);
                put(&mut self.attempt_timeout, key, v, errors);
            }
            "reserve" => {
                let v = duration_value(value, errors);
                put(&mut self.reserve, key, v, errors);
            }
            "min_attempt" => {
                let v = duration_value(value, errors);
                put(&mut self.min_attempt, key, v, errors);
            }
            "initial_backoff" => {
                let v = duration_value(value, errors);
                put(&mut self.initial_backoff, key, v, errors);
            }
            "max_backoff" => {
                let v = duration_value(value, errors);
                put(&mut self.max_backoff, key, v, errors);
            }
            "max_attempts" => {
                let v = attempts_value(value, errors);
                put(&mut self.max_attempts, key, v, errors);
            }
            "multiplier" => {
                let v = multiplier_value(value, errors);
                put(&mut self.multiplier, key, v, errors);
            }
            "jitter" => {
                let v = jitter_value(value, errors);
                put(&mut self.jitter, key, v, errors);
            }
            "backoff" => {
                let v = backoff_value(value, errors);
                put(&mut self.backoff, key, v, errors);
            }
            "reconcile" => put(&mut self.reconcile, key, Some(value), errors),
            "recover" => put(&mut self.recover, key, Some(value), errors),
            "classify" => put(&mut self.classify, key, Some(value), errors),
            "on_retry" => put(&mut self.on_retry, key, Some(value), errors),
            "policy" => put(&mut self.policy, key, Some(value), errors),
            "breaker" => put(
                &mut self.breaker,
                key,
                Some(BreakerArg::Static(value)),
                errors,
            ),
            "attempt" => {
                let v = ident_value(&value, errors);
                put(&mut self.attempt, key, v, errors);
            }
            "budget" => {
                let v = budget_value(value, errors);
                put(&mut self.budget, key, v, errors);
            }
            "crate" => {
                let v = crate_value(&value, errors);
                put(&mut self.krate, key, v, errors);
            }
            "nested" => {
                let v = nested_value(&value, errors);
                put(&mut self.nested_own, key, v, errors);
            }
            _ => unreachable!("every name in KEYS is matched above"),
        }
    }
}

impl Args {
    /// A key with a parenthesized list of `name = value` pairs: only
    /// `breaker(failure_threshold = …, open_for = …, half_open_probes = …)`.
    fn set_list(&mut self, key: &Ident, pairs: Vec<(Ident, Expr)>, errors: &mut Errors) {
        self.seen.push(key.to_string());
        if key != "breaker" {
            return errors.at(
                key.span(),
                format_args!(
                    "`{key}(…)` is not accepted: write `{key} = …` (only `breaker(…)` takes a list)"
                ),
            );
        }
        let (mut threshold, mut open_for, mut probes) = (None, None, None);
        let mut unknown = false;
        for (k, v) in pairs {
            match k.to_string().as_str() {
                "failure_threshold" => {
                    let v = count_value(peel(v), "failure_threshold", errors);
                    put(&mut threshold, &k, v, errors);
                }
                "open_for" => {
                    let v = duration_value(peel(v), errors);
                    put(&mut open_for, &k, v, errors);
                }
                "half_open_probes" => {
                    let v = count_value(peel(v), "half_open_probes", errors);
                    put(&mut probes, &k, v, errors);
                }
                other => {
                    unknown = true;
                    errors.at(
                        k.span(),
                        format_args!(
                            "unknown breaker setting `{other}`: use `failure_threshold`, `open_for` and `half_open_probes`"
                        ),
                    );
                }
            }
        }
        let Some(threshold) = threshold else {
            if unknown {
                return;
            }
            return errors.at(
                key.span(),
                "`breaker(…)` needs `failure_threshold = N` (N above `max_attempts`)",
            );
        };
        let open_for = open_for.unwrap_or(Value::Lit(30_000_000_000, key.span()));
        let arg = BreakerArg::Inline {
            threshold,
            open_for,
            probes,
        };
        put(&mut self.breaker, key, Some(arg), errors);
    }
}

/// A positive whole number (`failure_threshold`, `half_open_probes`).
fn count_value(e: Expr, what: &str, errors: &mut Errors) -> Option<Value<u32>> {
    let Expr::Lit(ExprLit { lit, .. }) = &e else {
        return Some(Value::Expr(e));
    };
    match lit {
        Lit::Int(i) => match i.base10_parse::<u32>() {
            Ok(0) | Err(_) => {
                errors.at(
                    i.span(),
                    format_args!("`{what}` must be a whole number of at least 1"),
                );
                None
            }
            Ok(n) => Some(Value::Lit(n, i.span())),
        },
        other => {
            errors.at(
                other.span(),
                format_args!("`{what}` must be a whole number of at least 1"),
            );
            None
        }
    }
}

/// Strip the invisible groups `macro_rules!` puts around substituted
/// fragments (`$mode:literal` arrives as `Expr::Group`), so literals passed
/// through a declarative macro are still checked as literals.
fn peel(e: Expr) -> Expr {
    match e {
        Expr::Group(g) => peel(*g.expr),
        other => other,
    }
}

fn unknown_key(key: &Ident) -> Error {
    let name = key.to_string();
    let mut msg = format!("unknown key `{name}`");
    if let Some((_, new)) = RENAMED.iter().find(|(old, _)| *old == name) {
        let _ = write!(msg, "; {new}");
    } else if let Some(near) = nearest(&name) {
        let _ = write!(msg, "; did you mean `{near}`?");
    }
    msg.push_str("\nvalid keys: ");
    msg.push_str(
        &KEYS
            .iter()
            .map(|k| format!("`{k}`"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    Error::new(key.span(), msg)
}

/// The accepted key closest to `name` by edit distance, if close enough.
fn nearest(name: &str) -> Option<&'static str> {
    KEYS.iter()
        .map(|k| (distance(name, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

fn str_lit(e: &Expr) -> Option<&syn::LitStr> {
    match e {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Some(s),
        _ => None,
    }
}

fn bool_lit(e: &Expr, errors: &mut Errors) -> Option<(bool, Span)> {
    if let Expr::Lit(ExprLit {
        lit: Lit::Bool(b), ..
    }) = e
    {
        return Some((b.value, b.span));
    }
    errors.at(
        e.span(),
        "`idempotent` must be `true` or `false` (or the bare flag `idempotent`): it is declared, never computed",
    );
    None
}

fn duration_value(e: Expr, errors: &mut Errors) -> Option<Value<u64>> {
    let Some(s) = str_lit(&e) else {
        if let Expr::Lit(ExprLit {
            lit: Lit::Int(_) | Lit::Float(_),
            ..
        }) = &e
        {
            errors.at(
                e.span(),
                "a bare number has no unit: write a duration literal such as \"250ms\" or \"2s\", or a `std::time::Duration` expression",
            );
            return None;
        }
        return Some(Value::Expr(e));
    };
    match duration::parse(&s.value()) {
        Ok(nanos) => Some(Value::Lit(nanos, s.span())),
        Err(why) => {
            errors.at(
                s.span(),
                format_args!("malformed duration {:?}: {why}", s.value()),
            );
            None
        }
    }
}

fn attempts_value(e: Expr, errors: &mut Errors) -> Option<Value<u32>> {
    if let Expr::Unary(ExprUnary {
        op: UnOp::Neg(_), ..
    }) = &e
    {
        errors.at(e.span(), "`max_attempts` must be at least 1");
        return None;
    }
    let Expr::Lit(ExprLit { lit, .. }) = &e else {
        return Some(Value::Expr(e));
    };
    let Lit::Int(i) = lit else {
        errors.at(
            lit.span(),
            "`max_attempts` is a whole number of attempts, the first one included",
        );
        return None;
    };
    match i.base10_parse::<u32>() {
        Ok(0) => {
            errors.at(
                i.span(),
                "`max_attempts = 0` would never call the function: it counts the first attempt, so use at least 1 (1 means no retries)",
            );
            None
        }
        Ok(n) => Some(Value::Lit(n, i.span())),
        Err(_) => {
            errors.at(i.span(), "`max_attempts` must fit in a `u32`");
            None
        }
    }
}

fn float_lit(e: &Expr) -> Option<(f64, Span)> {
    let (neg, inner) = match e {
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_),
            expr,
            ..
        }) => (true, &**expr),
        other => (false, other),
    };
    let Expr::Lit(ExprLit { lit, .. }) = inner else {
        return None;
    };
    let v = match lit {
        Lit::Float(f) => f.base10_parse::<f64>().ok()?,
        Lit::Int(i) => i.base10_parse::<f64>().ok()?,
        _ => return None,
    };
    Some((if neg { -v } else { v }, e.span()))
}

fn multiplier_value(e: Expr, errors: &mut Errors) -> Option<Value<f64>> {
    match float_lit(&e) {
        Some((m, span)) if m.is_finite() && m >= 1.0 => Some(Value::Lit(m, span)),
        Some((_, span)) => {
            errors.at(
                span,
                "`multiplier` must be at least 1.0: a smaller one would shrink the pauses",
            );
            None
        }
        None if matches!(e, Expr::Lit(_)) => {
            errors.at(e.span(), "`multiplier` is a number such as `2.0`");
            None
        }
        None => Some(Value::Expr(e)),
    }
}

fn jitter_value(e: Expr, errors: &mut Errors) -> Option<Value<JitterLit>> {
    if let Some(s) = str_lit(&e) {
        let j = match s.value().as_str() {
            "none" => JitterLit::None,
            "full" => JitterLit::Full,
            "equal" => JitterLit::Equal,
            "decorrelated" => JitterLit::Decorrelated,
            other => {
                errors.at(
                    s.span(),
                    format_args!(
                        "unknown jitter {other:?}: use \"none\", \"full\", \"equal\", \"decorrelated\", or a factor in [0, 1] for proportional jitter (e.g. `jitter = 0.2`)"
                    ),
                );
                return None;
            }
        };
        return Some(Value::Lit(j, s.span()));
    }
    match float_lit(&e) {
        Some((f, span)) if (0.0..=1.0).contains(&f) => {
            Some(Value::Lit(JitterLit::Proportional(f), span))
        }
        Some((f, span)) => {
            errors.at(
                span,
                format_args!(
                    "jitter factor {f} is outside [0, 1]: proportional jitter multiplies each pause by a factor in [1 − f, 1 + f]"
                ),
            );
            None
        }
        None => Some(Value::Expr(e)),
    }
}

fn backoff_value(e: Expr, errors: &mut Errors) -> Option<BackoffArg> {
    let Some(s) = str_lit(&e) else {
        return Some(BackoffArg::Expr(e));
    };
    let k = match s.value().as_str() {
        "constant" => Kind::Constant,
        "linear" => Kind::Linear,
        "exponential" => Kind::Exponential,
        "decorrelated" => Kind::Decorrelated,
        other => {
            errors.at(
                s.span(),
                format_args!(
                    "unknown backoff {other:?}: use \"constant\", \"linear\", \"exponential\" or \"decorrelated\", or a `retry::Backoff` expression"
                ),
            );
            return None;
        }
    };
    Some(BackoffArg::Kind(k))
}

fn ident_value(e: &Expr, errors: &mut Errors) -> Option<Ident> {
    if let Expr::Path(p) = e
        && p.qself.is_none()
        && let Some(id) = p.path.get_ident()
    {
        return Some(id.clone());
    }
    errors.at(
        e.span(),
        "`attempt` names the binding for the attempt context in the body, e.g. `attempt = at`",
    );
    None
}

fn budget_value(e: Expr, errors: &mut Errors) -> Option<BudgetArg> {
    if let Some(s) = str_lit(&e) {
        if s.value() == "none" {
            return Some(BudgetArg::Off(s.span()));
        }
        errors.at(
            s.span(),
            "`budget` is a `static` budget shared by several functions (`budget = PAYMENTS_BUDGET`) or \"none\"",
        );
        return None;
    }
    Some(BudgetArg::Expr(e))
}

fn nested_value(e: &Expr, errors: &mut Errors) -> Option<bool> {
    match str_lit(e).map(syn::LitStr::value).as_deref() {
        Some("defer") => Some(false),
        Some("own") => Some(true),
        _ => {
            errors.at(
                e.span(),
                "`nested` is \"defer\" (inside another retried call, make one attempt and let the outer loop retry; the default) or \"own\" (retry here too)",
            );
            None
        }
    }
}

fn crate_value(e: &Expr, errors: &mut Errors) -> Option<Path> {
    if let Some(s) = str_lit(e) {
        if let Ok(p) = s.parse::<Path>() {
            return Some(p);
        }
        errors.at(
            s.span(),
            format_args!(
                "{:?} is not a path: write the path of the `retry` crate, e.g. `crate = \"::my_retry\"`",
                s.value()
            ),
        );
        return None;
    }
    errors.at(
        e.span(),
        "`crate` takes the path as a string: `crate = \"::my_retry\"`",
    );
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_keys() {
        assert_eq!(nearest("max_attempt"), Some("max_attempts"));
        assert_eq!(nearest("deadlin"), Some("deadline"));
        assert_eq!(nearest("idempotnet"), Some("idempotent"));
        assert_eq!(nearest("zzzzzz"), None);
    }
}
