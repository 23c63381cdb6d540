//! Checks between the keys the user wrote, in one place, after parsing: what
//! must be declared, and keys that cannot go together. Rules about the values
//! themselves live in `retries-core` (`Policy::validate`) and are applied to a
//! literal policy at compile time by the expansion.

use proc_macro2::Span;

use crate::args::{Args, BackoffArg, Kind};
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
    if let Some(t) = &args.attempt_timeout {
        errors.at(
            t.span(),
            "`attempt_timeout` cannot be enforced on a blocking `fn`: a running thread cannot be cut off\n\
             = help: the `deadline` still bounds the call (checked before every attempt and pause); make the work itself time out, or make the function `async`",
        );
    }
}
