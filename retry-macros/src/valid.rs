//! Checks between the keys the user wrote, in one place, after parsing: what
//! must be declared, and keys that cannot go together. Rules about the values
//! themselves live in `retries-core` (`Policy::validate`) and are applied to a
//! literal policy at compile time by the expansion.

use proc_macro2::Span;
use syn::spanned::Spanned;

use crate::ast::{Args, BackoffArg, Kind, Value};
use crate::diag::Errors;

/// Report every cross-key problem of `args`; a missing key is reported at
/// `site` (the attribute, or the method of an annotated `impl` block).
pub(crate) fn validate(args: &Args, errors: &mut Errors, site: Span) {
    if args.incomplete || args.saw("skip") {
        return;
    }
    let call_site = site;
    if !args.saw("idempotent") {
        errors.at(
            call_site,
            "missing `idempotent`: declare whether this function is safe to repeat\n\
             = help: `idempotent` — repeating it is harmless: an unknown outcome (the request may have been processed) is retried\n\
             = help: `idempotent = false` — it is not: an unknown outcome stops the call, unless `reconcile = …` finds out by idempotency key whether the work was done",
        );
    }
    if !args.saw("deadline") && !args.saw("policy") {
        errors.at(
            call_site,
            "missing `deadline`: one deadline bounds every attempt and pause of the call, e.g. `deadline = \"2s\"` (or take it from a shared `policy = …`)",
        );
    }
    if let (Some((true, _)), Some(r)) = (args.idempotent, &args.reconcile) {
        errors.at(
            syn::spanned::Spanned::span(r),
            "`reconcile` is pointless on an idempotent function: it would simply be retried after an unknown outcome\n\
             = help: remove `reconcile`, or declare `idempotent = false` if repeating the work is not harmless",
        );
    }
    backoff_keys(args, errors);
    hedge_keys(args, errors);
}

/// Hedging is for operations safe to repeat, and takes no key that only a
/// sequential loop has.
fn hedge_keys(args: &Args, errors: &mut Errors) {
    let Some((_, _, span)) = &args.hedge else {
        return;
    };
    if let Some((false, _)) = args.idempotent {
        errors.at(
            *span,
            "`hedge` sends copies of the call at once: only an idempotent function may be hedged\n\
             = help: declare `idempotent` if concurrent copies are harmless, or remove `hedge`",
        );
    }
    for (key, given) in [
        (
            "attempt_timeout",
            args.attempt_timeout.as_ref().map(Value::span),
        ),
        (
            "retry_if",
            args.retry_if.as_ref().map(syn::spanned::Spanned::span),
        ),
        (
            "on_retry",
            args.on_retry.as_ref().map(syn::spanned::Spanned::span),
        ),
        ("max_attempts", args.max_attempts.as_ref().map(Value::span)),
    ] {
        if let Some(at) = given {
            errors.at(
                at,
                format_args!(
                    "`{key}` does not apply to a hedged call: copies are sent by `hedge(max_attempts = …, delay = …)`, not retried one after another"
                ),
            );
        }
    }
}

/// Backoff keys that do nothing with the kind written next to them.
fn backoff_keys(args: &Args, errors: &mut Errors) {
    let Some(BackoffArg::Kind(kind, _)) = &args.backoff else {
        return;
    };
    if !matches!(kind, Kind::Exponential | Kind::Grpc)
        && let Some(m) = &args.multiplier
    {
        errors.at(
            m.span(),
            "`multiplier` applies to `backoff = \"exponential\"` and `backoff = \"grpc\"` only",
        );
    }
    if *kind == Kind::Constant
        && let Some(m) = &args.max_backoff
    {
        errors.at(
            m.span(),
            "`max_backoff` does not apply to a constant backoff: its pause is `initial_backoff`",
        );
    }
}

/// Keys a blocking `fn` cannot honour.
pub(crate) fn blocking(args: &Args, errors: &mut Errors) {
    if let Some(e) = &args.concurrency {
        errors.at(
            e.span(),
            "`concurrency` needs an `async fn`: a blocking caller would hold its thread while it queued for a slot\n\
             = help: make the function `async`, or limit the threads that call it",
        );
    }
    if let Some((_, _, span)) = &args.hedge {
        errors.at(
            *span,
            "`hedge` needs an `async fn`: concurrent copies cannot run on one thread",
        );
    }
    if let Some(t) = &args.attempt_timeout {
        errors.at(
            t.span(),
            "`attempt_timeout` cannot be enforced on a blocking `fn`: a running thread cannot be cut off\n\
             = help: the `deadline` still bounds the call (checked before every attempt and pause); make the work itself time out, or make the function `async`",
        );
    }
}
