//! Code generation: the function's signature unchanged, its body run as the
//! attempt of a loop driven by `retry_core`'s engine.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{ItemFn, Path, ReturnType};

use crate::args::{Args, BackoffArg, BreakerArg, BudgetArg, Errors, JitterLit, Kind, Value};
use crate::item;

/// Expand `#[retryable(args)] f`, or emit the errors and a fallback.
pub(crate) fn retryable(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let args = crate::args::parse(attr, &mut errors);
    let f = match item::parse(item, &mut errors) {
        Ok(f) => f,
        Err(tokens) => {
            let errors = errors.into_tokens();
            return quote!(#errors #tokens);
        }
    };
    let shape_ok = item::check(&f, &mut errors);
    validate(&args, &mut errors);
    let krate = args
        .krate
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(::retry));
    if !shape_ok || !errors.is_empty() {
        let fallback = fallback(&f, &args, &krate, shape_ok);
        let errors = errors.into_tokens();
        return quote!(#errors #fallback);
    }
    generate(&f, &args, &krate)
}

/// Cross-key rules, in one place, after parsing.
fn validate(args: &Args, errors: &mut Errors) {
    if args.incomplete {
        return;
    }
    let call_site = Span::call_site();
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
            r.span(),
            "`reconcile` is pointless on an idempotent function: it would simply be retried after an unknown outcome\n\
             = help: remove `reconcile`, or declare `idempotent = false` if repeating the work is not harmless",
        );
    }
    validate_durations(args, errors);
    validate_backoff(args, errors);
    validate_breaker(args, errors);
}

/// The breaker rule, when both numbers are known here: the breaker sits under
/// the loop and counts every attempt, so its threshold must exceed
/// `max_attempts` or one failing call opens it.
fn validate_breaker(args: &Args, errors: &mut Errors) {
    let Some(BreakerArg::Inline {
        threshold: Value::Lit(threshold, span),
        ..
    }) = &args.breaker
    else {
        return;
    };
    let attempts = match &args.max_attempts {
        Some(Value::Lit(n, _)) => *n,
        None if args.policy.is_none() => 3,
        _ => return,
    };
    if *threshold <= attempts {
        errors.at(
            *span,
            format_args!(
                "`failure_threshold = {threshold}` is not above `max_attempts = {attempts}`: the breaker sits under the retry loop and counts every attempt, so one failing call would open it by itself\n= help: use `failure_threshold = {}` or more",
                attempts + 1
            ),
        );
    }
}

/// A duration key's value, when it is a literal.
fn lit(v: Option<&Value<u64>>) -> Option<u64> {
    v.and_then(|v| v.lit().copied())
}

/// Literal durations that break a `Policy` rule.
fn validate_durations(args: &Args, errors: &mut Errors) {
    if let Some(Value::Lit(0, s)) = &args.deadline {
        errors.at(*s, "`deadline` must be longer than zero");
    }
    if let Some(Value::Lit(0, s)) = &args.attempt_timeout {
        errors.at(*s, "`attempt_timeout` must be longer than zero");
    }
    if let (Some(d), Some(r)) = (lit(args.deadline.as_ref()), &args.reserve)
        && let Some(rv) = r.lit()
    {
        if *rv >= d {
            errors.at(
                r.span(),
                "`reserve` must be shorter than `deadline`: it is kept back from the deadline for the caller, so nothing would be left for attempts",
            );
        } else if rv + lit(args.min_attempt.as_ref()).unwrap_or(1_000_000) > d {
            errors.at(
                r.span(),
                "`reserve` plus `min_attempt` (1ms unless set) must fit in `deadline`",
            );
        }
    }
    if let (Some(d), Some(m)) = (lit(args.deadline.as_ref()), &args.min_attempt)
        && m.lit().is_some_and(|m| *m > d)
    {
        errors.at(m.span(), "`min_attempt` must not exceed `deadline`");
    }
}

/// The backoff shorthand keys, against `backoff` and each other.
fn validate_backoff(args: &Args, errors: &mut Errors) {
    let shorthand: Vec<(&str, Span)> = [
        (
            "initial_backoff",
            args.initial_backoff.as_ref().map(Value::span),
        ),
        ("max_backoff", args.max_backoff.as_ref().map(Value::span)),
        ("multiplier", args.multiplier.as_ref().map(Value::span)),
        ("jitter", args.jitter.as_ref().map(Value::span)),
    ]
    .into_iter()
    .filter_map(|(k, s)| s.map(|s| (k, s)))
    .collect();
    match &args.backoff {
        Some(BackoffArg::Expr(_)) => {
            for (key, span) in &shorthand {
                errors.at(
                    *span,
                    format_args!(
                        "`{key}` cannot be combined with `backoff = <expression>`: set it on the `retry::Backoff` value instead"
                    ),
                );
            }
        }
        other => {
            let kind = match other {
                Some(BackoffArg::Kind(k)) => *k,
                _ => Kind::Exponential,
            };
            if kind != Kind::Exponential
                && let Some(m) = &args.multiplier
            {
                errors.at(
                    m.span(),
                    "`multiplier` applies to `backoff = \"exponential\"` only",
                );
            }
            if kind == Kind::Constant
                && let Some(m) = &args.max_backoff
            {
                errors.at(
                    m.span(),
                    "`max_backoff` does not apply to a constant backoff: its pause is `initial_backoff`",
                );
            }
            if let (Some(i), Some(m)) = (lit(args.initial_backoff.as_ref()), &args.max_backoff)
                && m.lit().is_some_and(|m| *m < i)
            {
                errors.at(
                    m.span(),
                    "`max_backoff` must not be below `initial_backoff`",
                );
            }
        }
    }
}

/// On any error: the function as written, so the rest of the crate (and the
/// IDE) keeps working, and no error follows from the missing expansion. The
/// attempt binding, if any, is declared so the body type-checks.
fn fallback(f: &ItemFn, args: &Args, krate: &Path, shape_ok: bool) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = f;
    if let (Some(at), true) = (&args.attempt, shape_ok) {
        quote! {
            #(#attrs)*
            #[allow(unreachable_code, unused_variables)]
            #vis #sig {
                let #at: &#krate::Attempt = ::core::unreachable!();
                #block
            }
        }
    } else {
        quote!(#f)
    }
}

/// `true` when every policy value is a literal (checked here), so the policy
/// can be a `const`: a `'static` reference in the generated code, no storage
/// in the function's future.
fn policy_is_literal(args: &Args) -> bool {
    let lit = |v: Option<&Value<u64>>| v.is_none_or(|v| v.lit().is_some());
    args.policy.is_none()
        && lit(args.deadline.as_ref())
        && lit(args.attempt_timeout.as_ref())
        && lit(args.reserve.as_ref())
        && lit(args.min_attempt.as_ref())
        && lit(args.initial_backoff.as_ref())
        && lit(args.max_backoff.as_ref())
        && args.max_attempts.as_ref().is_none_or(|v| v.lit().is_some())
        && args.multiplier.as_ref().is_none_or(|v| v.lit().is_some())
        && args.jitter.as_ref().is_none_or(|v| v.lit().is_some())
        && !matches!(args.backoff, Some(BackoffArg::Expr(_)))
}

/// A `&Policy` for the engine: a `const` when every value is a literal.
fn policy_ref(args: &Args, krate: &Path) -> TokenStream {
    let p = policy(args, krate);
    if policy_is_literal(args) {
        quote! {{
            const __RETRY_POLICY: #krate::Policy = #p;
            &__RETRY_POLICY
        }}
    } else {
        quote!(&#p)
    }
}

fn duration(v: &Value<u64>, krate: &Path) -> TokenStream {
    match v {
        Value::Lit(n, span) => quote_spanned!(*span=> #krate::__private::Duration::from_nanos(#n)),
        Value::Expr(e) => quote_spanned!(e.span()=> (#e)),
    }
}

fn policy(args: &Args, krate: &Path) -> TokenStream {
    let mut p = match (&args.policy, &args.deadline) {
        (Some(base), _) => quote_spanned!(base.span()=> (#base)),
        (None, Some(d)) => {
            let d = duration(d, krate);
            quote!(#krate::Policy::new(#d))
        }
        (None, None) => unreachable!("validate() requires a deadline or a policy"),
    };
    if args.policy.is_some()
        && let Some(d) = &args.deadline
    {
        let d = duration(d, krate);
        p = quote!(#p.with_deadline(#d));
    }
    if let Some(n) = &args.max_attempts {
        let n = match n {
            Value::Lit(n, span) => quote_spanned!(*span=> #n),
            Value::Expr(e) => quote_spanned!(e.span()=> (#e)),
        };
        p = quote!(#p.with_max_attempts(#n));
    }
    for (value, setter) in [
        (&args.attempt_timeout, quote!(with_attempt_timeout)),
        (&args.reserve, quote!(with_reserve)),
        (&args.min_attempt, quote!(with_min_attempt)),
    ] {
        if let Some(v) = value {
            let v = duration(v, krate);
            p = quote!(#p.#setter(#v));
        }
    }
    if let Some(b) = backoff(args, krate) {
        p = quote!(#p.with_backoff(#b));
    }
    p
}

fn backoff(args: &Args, krate: &Path) -> Option<TokenStream> {
    let kind = match &args.backoff {
        Some(BackoffArg::Expr(e)) => return Some(quote_spanned!(e.span()=> (#e))),
        Some(BackoffArg::Kind(k)) => *k,
        None if args.initial_backoff.is_none()
            && args.max_backoff.is_none()
            && args.multiplier.is_none()
            && args.jitter.is_none() =>
        {
            return None;
        }
        None => Kind::Exponential,
    };
    let initial = args.initial_backoff.as_ref().map_or_else(
        || quote!(#krate::__private::Duration::from_millis(100)),
        |v| duration(v, krate),
    );
    let max = args.max_backoff.as_ref().map_or_else(
        || quote!(#krate::__private::Duration::from_secs(1)),
        |v| duration(v, krate),
    );
    let multiplier = match &args.multiplier {
        Some(Value::Lit(m, span)) => quote_spanned!(*span=> #m),
        Some(Value::Expr(e)) => quote_spanned!(e.span()=> (#e)),
        None => quote!(2.0),
    };
    let mut b = match kind {
        Kind::Constant => quote!(#krate::Backoff::constant(#initial)),
        Kind::Linear => quote!(#krate::Backoff::linear(#initial, #initial, #max)),
        Kind::Exponential => quote!(#krate::Backoff::exponential(#initial, #multiplier, #max)),
        Kind::Decorrelated => quote!(#krate::Backoff::decorrelated(#initial, #max)),
    };
    if let Some(j) = &args.jitter {
        let j = match j {
            Value::Lit(j, span) => {
                let name = match j {
                    JitterLit::None => quote!(None),
                    JitterLit::Full => quote!(Full),
                    JitterLit::Equal => quote!(Equal),
                    JitterLit::Decorrelated => quote!(Decorrelated),
                    JitterLit::Proportional(f) => quote!(Proportional(#f)),
                };
                quote_spanned!(*span=> #krate::Jitter::#name)
            }
            Value::Expr(e) => quote_spanned!(e.span()=> (#e)),
        };
        b = quote!(#b.with_jitter(#j));
    }
    Some(b)
}

/// The budget passed to the engine: the function's own token bucket unless
/// the attribute names one.
fn budget(args: &Args, krate: &Path) -> TokenStream {
    match &args.budget {
        None => quote! {{
            static __RETRY_BUDGET: #krate::TokenBucket = #krate::TokenBucket::DEFAULT;
            &__RETRY_BUDGET
        }},
        Some(BudgetArg::Off(span)) => quote_spanned!(*span=> &#krate::Unlimited),
        Some(BudgetArg::Expr(e)) => quote_spanned!(e.span()=> &#e),
    }
}

/// The breaker under the loop, if any: a named `static`, or one of the
/// function's own for `breaker(…)`.
fn breaker(args: &Args, krate: &Path) -> TokenStream {
    match &args.breaker {
        None => quote!(::core::option::Option::None::<&'static #krate::NoBreaker>),
        Some(BreakerArg::Static(e)) => quote_spanned!(e.span()=> ::core::option::Option::Some(&#e)),
        Some(BreakerArg::Inline {
            threshold,
            open_for,
            probes,
        }) => {
            let threshold = match threshold {
                Value::Lit(n, span) => quote_spanned!(*span=> #n),
                Value::Expr(e) => quote_spanned!(e.span()=> (#e)),
            };
            let open_for = duration(open_for, krate);
            let probes = probes.as_ref().map(|p| {
                let p = match p {
                    Value::Lit(n, span) => quote_spanned!(*span=> #n),
                    Value::Expr(e) => quote_spanned!(e.span()=> (#e)),
                };
                quote!(.with_half_open_probes(#p))
            });
            quote! {{
                static __RETRY_BREAKER: #krate::CircuitBreaker =
                    #krate::CircuitBreaker::new(#threshold, #open_for)#probes;
                ::core::option::Option::Some(&__RETRY_BREAKER)
            }}
        }
    }
}

// One `quote!` mirrors the whole expansion; split, its shape would be harder to read.
#[allow(clippy::too_many_lines)]
fn generate(f: &ItemFn, args: &Args, krate: &Path) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = f;
    let ReturnType::Type(_, ret) = &sig.output else {
        unreachable!("item::check() requires a return type")
    };
    let ret_span = ret.span();
    let ret_infer = item::inferable(ret);
    let policy = policy_ref(args, krate);
    let idempotent = args.idempotent.is_some_and(|(b, _)| b);
    let name = sig.ident.to_string();
    let nested = if args.nested_own == Some(true) {
        quote!(#krate::__private::Nested::Own)
    } else {
        quote!(#krate::__private::Nested::Defer)
    };
    let has_reconcile = args.reconcile.is_some();

    let budget = budget(args, krate);
    let breaker = breaker(args, krate);
    let classify = match &args.classify {
        None => quote_spanned!(ret_span=> #krate::__private::by_classify::<#ret_infer>()),
        Some(e) => quote_spanned!(e.span()=> #krate::__private::classify_with(#e)),
    };
    let reconcile = match &args.reconcile {
        None => quote!(#krate::__private::NoReconcile),
        Some(e) => quote_spanned!(e.span()=> #krate::__private::reconcile_with(#e)),
    };
    let on_retry = match &args.on_retry {
        None => quote!(#krate::__private::NoHook),
        Some(e) => quote_spanned!(e.span()=> #krate::__private::on_retry_hook(#e)),
    };
    let binding = args
        .attempt
        .as_ref()
        .map(|at| quote!(let #at: &#krate::Attempt = &__retry_attempt;));
    let run = quote_spanned! {ret_span=>
        let __retry_outcome = #krate::__private::run_attempt_as::<#ret_infer, _>(&__retry_attempt, async {
            #binding
            #block
        })
        .await;
    };
    let stop = match &args.recover {
        None => quote_spanned! {ret_span=>
            ::core::result::Result::Err(#krate::__private::into_error(__retry_failure))
        },
        Some(e) => quote_spanned! {e.span()=>
            #krate::__private::IsResult::into_result(
                #krate::__private::recover::<_, _, #ret_infer, _>(#e, __retry_failure).await,
            )
        },
    };
    let finish = quote_spanned!(ret_span=> #krate::__private::IsResult::from_result);

    quote! {
        #(#attrs)*
        #vis #sig {
            let __retry_policy: &#krate::Policy = #policy;
            let mut __retry_call = #krate::__private::Call::new(
                {
                    static __RETRY_NAME: #krate::observe::Name = #krate::observe::Name::new(
                        ::core::concat!(::core::module_path!(), "::", #name),
                    );
                    &__RETRY_NAME
                },
                __retry_policy,
                #idempotent,
                #has_reconcile,
                #budget,
                #breaker,
                #nested,
            );
            let __retry_result = loop {
                let __retry_attempt = match __retry_call.start() {
                    ::core::result::Result::Ok(__retry_attempt) => __retry_attempt,
                    ::core::result::Result::Err(__retry_failure) => {
                        break ::core::result::Result::Err(__retry_failure);
                    }
                };
                #run
                let __retry_outcome = match __retry_call.success(&__retry_attempt, __retry_outcome) {
                    #krate::__private::ControlFlow::Break(__retry_value) => {
                        break ::core::result::Result::Ok(__retry_value);
                    }
                    #krate::__private::ControlFlow::Continue(__retry_outcome) => __retry_outcome,
                };
                if let #krate::__private::ControlFlow::Break(__retry_done) = __retry_call
                    .finish(
                        &__retry_attempt,
                        __retry_outcome,
                        &#classify,
                        &mut #reconcile,
                        &mut #on_retry,
                    )
                    .await
                {
                    break __retry_done;
                }
            };
            #finish(match __retry_result {
                ::core::result::Result::Ok(__retry_value) => ::core::result::Result::Ok(__retry_value),
                ::core::result::Result::Err(__retry_failure) => #stop,
            })
        }
    }
}
