//! The keys of `#[retryable(...)]`: one setter per key (duplicates checked
//! once), parsed into a list of what the user wrote. No defaults live here.

use proc_macro2::TokenStream;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Expr, Ident, Token};

use crate::ast::{Args, BreakerArg, HedgeDelay, KEYS};
use crate::diag::{Errors, unknown_key};
use crate::lit::{
    attempts_value, backoff_value, bool_lit, budget_value, count_value, crate_value,
    duration_value, ident_value, jitter_value, multiplier_value, nested_value, peel,
};

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
        if name == "skip" {
            return errors.at(
                key.span(),
                "`skip` opts a method out of the `#[retryable(...)]` on its `impl` block; on a function of its own it means nothing: remove the attribute",
            );
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
            "retry_if" => put(&mut self.retry_if, key, Some(value), errors),
            "policy" => put(&mut self.policy, key, Some(value), errors),
            "concurrency" => put(&mut self.concurrency, key, Some(value), errors),
            "rate_limit" => put(&mut self.rate_limit, key, Some(value), errors),
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
            "hedge" => errors.at(key.span(), HEDGE_FORM),
            "nested" => {
                let v = nested_value(&value, errors);
                put(&mut self.nested_own, key, v, errors);
            }
            _ => unreachable!("every name in KEYS is matched above"),
        }
    }
}

/// How `hedge` is written.
const HEDGE_FORM: &str = "write `hedge(max_attempts = N, delay = \"…\")` (or `learned = DELAY` for a `retries::LearnedDelay`)";

impl Args {
    /// `hedge(max_attempts = N, delay = "50ms")`, or `learned = DELAY`
    /// instead of `delay`.
    fn set_hedge(&mut self, key: &Ident, pairs: Vec<(Ident, Expr)>, errors: &mut Errors) {
        let (mut attempts, mut delay) = (None, None);
        // A setting given but malformed has its own error: no second one.
        let mut malformed = false;
        for (k, v) in pairs {
            match k.to_string().as_str() {
                "max_attempts" => {
                    let v = attempts_value(peel(v), errors);
                    malformed |= v.is_none();
                    put(&mut attempts, &k, v, errors);
                }
                "delay" | "learned" if delay.is_some() => {
                    malformed = true;
                    errors.at(
                        k.span(),
                        "give `hedge(…)` one `delay = \"…\"` (fixed) or one `learned = DELAY` (a `retries::LearnedDelay`), not both nor twice",
                    );
                }
                "delay" => {
                    let v = duration_value(peel(v), errors);
                    malformed |= v.is_none();
                    delay = v.map(HedgeDelay::Fixed);
                }
                "learned" => delay = Some(HedgeDelay::Learned(peel(v))),
                other => errors.at(
                    k.span(),
                    format_args!(
                        "unknown hedging setting `{other}`: use `max_attempts` and `delay` (or `learned`)"
                    ),
                ),
            }
        }
        match (attempts, delay) {
            (Some(a), Some(d)) => put(&mut self.hedge, key, Some((a, d, key.span())), errors),
            _ if malformed => {}
            _ => errors.at(
                key.span(),
                "`hedge(…)` needs `max_attempts = N` (copies in all) and `delay = \"…\"` (the wait before the next copy) or `learned = DELAY` (a `retries::LearnedDelay`)",
            ),
        }
    }
}

impl Args {
    /// A key with a parenthesized list of `name = value` pairs: only
    /// `breaker(failure_threshold = …, open_for = …, half_open_probes = …)`.
    fn set_list(&mut self, key: &Ident, pairs: Vec<(Ident, Expr)>, errors: &mut Errors) {
        self.seen.push(key.to_string());
        if key == "hedge" {
            return self.set_hedge(key, pairs, errors);
        }
        if key != "breaker" {
            return errors.at(
                key.span(),
                format_args!(
                    "`{key}(…)` is not accepted: write `{key} = …` (only `breaker(…)` and `hedge(…)` take a list)"
                ),
            );
        }
        let (mut threshold, mut open_for, mut probes) = (None, None, None);
        // An unknown or malformed setting has its own error: no second one.
        let mut reported = false;
        for (k, v) in pairs {
            match k.to_string().as_str() {
                "failure_threshold" => {
                    let v = count_value(peel(v), "failure_threshold", errors);
                    reported |= v.is_none();
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
                    reported = true;
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
            if reported {
                return;
            }
            return errors.at(
                key.span(),
                "`breaker(…)` needs `failure_threshold = N` (N above `max_attempts`)",
            );
        };
        let arg = BreakerArg::Inline {
            threshold,
            open_for,
            probes,
        };
        put(&mut self.breaker, key, Some(arg), errors);
    }
}
