//! The thin expansion: the function's signature unchanged, its body wrapped
//! once as the attempt of the engine's loop (`retries::__private::drive!`),
//! the keys forwarded as setters of `retries-core`'s `Policy` and builder.
//! Generated locals are `Span::mixed_site()`, so no user name can collide.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, Generics, Ident, ItemFn, Path, ReturnType};

use crate::ast::{Args, BackoffArg, BreakerArg, BudgetArg, JitterLit, Kind, Value};
use crate::item::{self, rebraced, split_attrs};

/// `let local = &(e);`, borrowed for the call (a temporary such as
/// `self.budget.clone()` lives as long as the local), then passed through
/// `check` at `e`'s place, so a value of the wrong kind is reported where it
/// is written.
fn borrowed(e: &Expr, local: &Ident, check: &TokenStream) -> TokenStream {
    let arg = Ident::new(&local.to_string(), Span::mixed_site().located_at(e.span()));
    quote_spanned!(e.span()=> let #local = &(#e); let #local = #check(#arg);)
}

/// A local of the expansion, unnameable from user code.
fn local(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

/// `tokens` with every token spanned at `span`, so that an error in the
/// expression they form (a compile-time check) points at what the user wrote.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut t| {
            if let proc_macro2::TokenTree::Group(g) = &t {
                let mut group = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), span));
                group.set_span(span);
                t = proc_macro2::TokenTree::Group(group);
            } else {
                t.set_span(span);
            }
            t
        })
        .collect()
}

/// A literal or an expression, as tokens spanned on what the user wrote.
fn tokens<T: quote::ToTokens>(v: &Value<T>) -> TokenStream {
    match v {
        Value::Lit(x, span) => quote_spanned!(*span=> #x),
        Value::Expr(e) => quote_spanned!(e.span()=> #e),
    }
}

fn duration(v: &Value<u64>, krate: &Path) -> TokenStream {
    match v {
        Value::Lit(n, span) => quote_spanned!(*span=> #krate::__private::Duration::from_nanos(#n)),
        Value::Expr(e) => quote_spanned!(e.span()=> #e),
    }
}

/// The policy's keys the attribute wrote, each with its span (for the
/// checks of a `const` policy, each spanned on its key).
fn given(args: &Args) -> Vec<(&'static str, Span)> {
    let mut given = Vec::new();
    if let Some(d) = &args.deadline {
        given.push(("deadline", d.span()));
    }
    if let Some(n) = &args.max_attempts {
        given.push(("max_attempts", n.span()));
    }
    if let Some(BackoffArg::Kind(_, span)) = &args.backoff {
        given.push(("backoff", *span));
    }
    for (key, value) in [
        ("attempt_timeout", &args.attempt_timeout),
        ("reserve", &args.reserve),
        ("min_attempt", &args.min_attempt),
        ("initial_backoff", &args.initial_backoff),
        ("max_backoff", &args.max_backoff),
    ] {
        if let Some(v) = value {
            given.push((key, v.span()));
        }
    }
    if let Some(m) = &args.multiplier {
        given.push(("multiplier", m.span()));
    }
    if let Some(j) = &args.jitter {
        given.push(("jitter", j.span()));
    }
    given
}

/// One setter call per key written, in an order where a later key refines an
/// earlier one (a backoff kind brings its default jitter; `jitter` overrides
/// it).
fn policy_chain(args: &Args, krate: &Path) -> TokenStream {
    let mut p = match (&args.policy, &args.deadline) {
        // A receiver: parenthesized unless it is already a single term
        // (parentheses there would draw `unused_parens` in the user's crate).
        (Some(base), _) => match base {
            Expr::Path(_)
            | Expr::Field(_)
            | Expr::MethodCall(_)
            | Expr::Call(_)
            | Expr::Macro(_)
            | Expr::Paren(_) => quote_spanned!(base.span()=> #base),
            _ => quote_spanned!(base.span()=> (#base)),
        },
        (None, Some(d)) => {
            let d = duration(d, krate);
            quote!(#krate::Policy::new(#d))
        }
        (None, None) => unreachable!("valid::validate() requires a deadline or a policy"),
    };
    if args.policy.is_some()
        && let Some(d) = &args.deadline
    {
        let d = duration(d, krate);
        p = quote!(#p.with_deadline(#d));
    }
    if let Some(n) = &args.max_attempts {
        let n = tokens(n);
        p = quote!(#p.with_max_attempts(#n));
    }
    match &args.backoff {
        Some(BackoffArg::Kind(k, span)) => {
            let kind = match k {
                Kind::Constant => quote!(Constant),
                Kind::Linear => quote!(Linear),
                Kind::Exponential => quote!(Exponential),
                Kind::Decorrelated => quote!(Decorrelated),
                Kind::Grpc => quote!(Grpc),
            };
            p = quote_spanned!(*span=> #p.with_backoff_kind(#krate::BackoffKind::#kind));
        }
        Some(BackoffArg::Expr(e)) => p = quote_spanned!(e.span()=> #p.with_backoff(#e)),
        None => {}
    }
    for (value, setter) in [
        (&args.attempt_timeout, quote!(with_attempt_timeout)),
        (&args.reserve, quote!(with_reserve)),
        (&args.min_attempt, quote!(with_min_attempt)),
        (&args.initial_backoff, quote!(with_initial_backoff)),
        (&args.max_backoff, quote!(with_max_backoff)),
    ] {
        if let Some(v) = value {
            let v = duration(v, krate);
            p = quote!(#p.#setter(#v));
        }
    }
    if let Some(m) = &args.multiplier {
        let m = tokens(m);
        p = quote!(#p.with_multiplier(#m));
    }
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
            Value::Expr(e) => quote_spanned!(e.span()=> #e),
        };
        p = quote!(#p.with_jitter(#j));
    }
    p
}

/// `true` when the policy can be a `const`: every value is a literal, and a
/// base `policy` is a path to a `const` (named in upper case, not through
/// `Self` or a generic parameter).
fn policy_is_const(args: &Args, generics: &Generics) -> bool {
    fn lit<T>(v: Option<&Value<T>>) -> bool {
        v.is_none_or(|v| v.lit().is_some())
    }
    let base_is_const = match &args.policy {
        None => true,
        Some(Expr::Path(p)) if p.qself.is_none() => {
            let segments = &p.path.segments;
            let first = segments.first().map(|s| s.ident.to_string());
            let generic = generics
                .type_params()
                .any(|t| Some(t.ident.to_string()) == first);
            !generic
                && first.as_deref() != Some("Self")
                && segments.last().is_some_and(|s| {
                    let name = s.ident.to_string();
                    name.chars().any(|c| c.is_ascii_uppercase())
                        && name
                            .chars()
                            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                })
        }
        Some(_) => false,
    };
    base_is_const
        && lit(args.deadline.as_ref())
        && lit(args.max_attempts.as_ref())
        && lit(args.attempt_timeout.as_ref())
        && lit(args.reserve.as_ref())
        && lit(args.min_attempt.as_ref())
        && lit(args.initial_backoff.as_ref())
        && lit(args.max_backoff.as_ref())
        && lit(args.multiplier.as_ref())
        && lit(args.jitter.as_ref())
        && !matches!(args.backoff, Some(BackoffArg::Expr(_)))
}

/// A `&Policy` for the call. A `const` when it can be, checked at compile
/// time by `Policy::validate` (each rule reported on the first key it
/// concerns) and by the breaker rule; otherwise built at each call.
fn policy(args: &Args, krate: &Path, generics: &Generics) -> TokenStream {
    if !policy_is_const(args, generics) {
        let chain = policy_chain(args, krate);
        return quote!(&{ #chain });
    }
    let given = given(args);
    // Without `policy = …`, the policy is a type named by its values: its
    // `const`s are evaluated once per crate for every fn that writes the
    // same (`retries_core::__private::lit`).
    let lit = literal_type(args, krate);
    let (broken, policy) = match &lit {
        Some(_) => (quote!(__RetriesLit::BROKEN), quote!(__RetriesLit::POLICY)),
        None => (quote!(__RETRIES_BROKEN), quote!(__RETRIES_POLICY)),
    };
    let names = given.iter().map(|(k, _)| k);
    let checks = given
        .iter()
        .map(|(key, span)| respan(quote!(#krate::__private::check(#broken, #key);), *span));
    let breaker = match &args.breaker {
        Some(BreakerArg::Inline {
            threshold: Value::Lit(t, span),
            ..
        }) => Some(respan(
            quote!(#krate::__private::check_breaker(&#policy, #t);),
            *span,
        )),
        _ => None,
    };
    if let Some(lit) = lit {
        return quote! {{
            type __RetriesLit = #lit;
            const _: () = {
                #(#checks)*
                #krate::__private::check_rest(#broken);
                #breaker
            };
            &#policy
        }};
    }
    let chain = policy_chain(args, krate);
    quote! {{
        const __RETRIES_POLICY: #krate::Policy = #chain;
        // Validated once; each key's check is spanned on that key (an item,
        // not a local: a key from a `macro_rules!` expansion carries that
        // macro's hygiene, under which a local of ours is not in scope).
        const __RETRIES_BROKEN: #krate::__private::Broken =
            #krate::__private::broken(&__RETRIES_POLICY, &[#(#names),*]);
        const _: () = {
            #(#checks)*
            #krate::__private::check_rest(__RETRIES_BROKEN);
            #breaker
        };
        &__RETRIES_POLICY
    }}
}

/// `retries_core::__private::Lit` with this attribute's values, when it
/// has no `policy = …` (the caller checked that every value is a literal);
/// the layout of its parameters is that file's.
fn literal_type(args: &Args, krate: &Path) -> Option<TokenStream> {
    fn lit<T: Copy + Default>(v: Option<&Value<T>>, bit: u32, given: &mut u32) -> T {
        match v {
            Some(Value::Lit(x, _)) => {
                *given |= bit;
                *x
            }
            _ => T::default(),
        }
    }
    if args.policy.is_some() {
        return None;
    }
    let mut given = 0u32;
    let deadline = lit(args.deadline.as_ref(), 0, &mut given);
    let attempts = lit(args.max_attempts.as_ref(), 1, &mut given);
    let kind: u8 = match &args.backoff {
        Some(BackoffArg::Kind(k, _)) => {
            given |= 1 << 1;
            match k {
                Kind::Constant => 0,
                Kind::Linear => 1,
                Kind::Exponential => 2,
                Kind::Decorrelated => 3,
                Kind::Grpc => 4,
            }
        }
        Some(BackoffArg::Expr(_)) => return None,
        None => 0,
    };
    let attempt_timeout = lit(args.attempt_timeout.as_ref(), 1 << 2, &mut given);
    let reserve = lit(args.reserve.as_ref(), 1 << 3, &mut given);
    let min_attempt = lit(args.min_attempt.as_ref(), 1 << 4, &mut given);
    let initial = lit(args.initial_backoff.as_ref(), 1 << 5, &mut given);
    let max_backoff = lit(args.max_backoff.as_ref(), 1 << 6, &mut given);
    let multiplier = lit(args.multiplier.as_ref(), 1 << 7, &mut given).to_bits();
    let (jitter, fraction): (u8, u64) = match &args.jitter {
        Some(Value::Lit(j, _)) => {
            given |= 1 << 8;
            match j {
                JitterLit::None => (0, 0),
                JitterLit::Full => (1, 0),
                JitterLit::Equal => (2, 0),
                JitterLit::Decorrelated => (3, 0),
                JitterLit::Proportional(f) => (4, f.to_bits()),
            }
        }
        Some(Value::Expr(_)) => return None,
        None => (0, 0),
    };
    // Packed as `retries_core::__private::lit` reads them: a const
    // parameter costs each use, so the common keys take one.
    let pack = |low: u64, high: u64| {
        proc_macro2::Literal::u128_unsuffixed(u128::from(low) | u128::from(high) << 64)
    };
    let head = proc_macro2::Literal::u128_unsuffixed(
        u128::from(deadline)
            | u128::from(attempts) << 64
            | u128::from(kind) << 96
            | u128::from(given) << 104,
    );
    // Only `max_attempts` and a backoff kind besides the deadline.
    if given & !0b11 == 0 {
        return Some(quote!(#krate::__private::Lit<#head>));
    }
    let limits = pack(attempt_timeout, reserve);
    let pauses = pack(min_attempt, initial);
    let growth = pack(max_backoff, multiplier);
    let spread = pack(fraction, u64::from(jitter));
    Some(quote!(#krate::__private::LitAll<#head, #limits, #pauses, #growth, #spread>))
}

/// The breaker's own static for `breaker(…)`; its settings are checked by the
/// `const` constructor of `CircuitBreaker`.
fn inline_breaker(
    threshold: &Value<u32>,
    open_for: Option<&Value<u64>>,
    probes: Option<&Value<u32>>,
    krate: &Path,
) -> TokenStream {
    let t = tokens(threshold);
    let open_for = open_for.map_or_else(
        || quote!(#krate::CircuitBreaker::DEFAULT_OPEN_FOR),
        |d| duration(d, krate),
    );
    let probes = probes.map(|p| {
        let p = tokens(p);
        quote_spanned!(p.span()=> .with_half_open_probes(#p))
    });
    quote_spanned! {threshold.span()=> {
        static __RETRIES_BREAKER: #krate::CircuitBreaker =
            #krate::CircuitBreaker::new(#t, #open_for)#probes;
        &__RETRIES_BREAKER
    }}
}

/// The description of the call (`retries::call` under the function's own
/// name), with only what the attribute says; and the locals it borrows.
fn spec(
    args: &Args,
    krate: &Path,
    ret: &syn::Type,
    err_of: &syn::Type,
    ret_span: Span,
    policy_local: &Ident,
    sig: &syn::Signature,
) -> (Vec<TokenStream>, TokenStream) {
    let name = sig.ident.to_string();
    let blocking = sig.asyncness.is_none();
    let mut lets = Vec::new();
    let mut spec = quote! {
        // The name, and (with `metrics`) the keys of its metrics over its
        // labels, made at compile time.
        #krate::__private::spec(
            #policy_local,
            #krate::__private::name!(::core::concat!(::core::module_path!(), "::", #name)),
        )
    };
    spec = match args.idempotent {
        Some((true, span)) => quote_spanned!(span=> #spec.idempotent()),
        Some((false, span)) => quote_spanned!(span=> #spec.not_idempotent()),
        None => unreachable!("valid::validate() requires `idempotent`"),
    };
    // The error type, projected from a concrete form of the return type, so
    // that hooks are typed by it even when the success type is `impl Trait`.
    let err = quote_spanned!(ret_span=> <#err_of as #krate::__private::IsResult>::Err);
    spec = match &args.classify {
        // The error type's own `Classify`, named by its public path: a
        // missing implementation is reported on the return type with the
        // trait's note, and no bound of a `__private` item.
        None => quote_spanned!(ret_span=>
            #spec.classify(<#err as #krate::Classify>::classify as fn(&#err) -> #krate::Verdict)
        ),
        Some(e) => {
            quote_spanned!(e.span()=> #spec.classify(#krate::__private::classify::<#err, _>(#e)))
        }
    };
    if let Some(e) = &args.reconcile {
        spec = if blocking {
            quote_spanned!(e.span()=> #spec.reconcile_blocking(#krate::__private::reconcile_blocking::<#ret, _>(#e)))
        } else {
            quote_spanned!(e.span()=> #spec.reconcile(#krate::__private::reconcile::<#ret, _, _>(#e)))
        };
    }
    if let Some(e) = &args.retry_if {
        // The value's type is the function's success type, so a closure of
        // another type is reported against it, once.
        let ok = quote_spanned!(ret_span=> <#ret as #krate::__private::IsResult>::Ok);
        spec = quote_spanned!(e.span()=> #spec.retry_if::<#ok, _>(#e));
    }
    if let Some(e) = &args.on_retry {
        spec =
            quote_spanned!(e.span()=> #spec.on_retry(#krate::__private::on_retry::<#err, _>(#e)));
    }
    match &args.budget {
        None => {}
        Some(BudgetArg::Off(span)) => spec = quote_spanned!(*span=> #spec.budget(#krate::NoBudget)),
        Some(BudgetArg::Expr(e)) => {
            let b = local("__retries_budget");
            lets.push(borrowed(e, &b, &quote!(#krate::__private::budget)));
            spec = quote!(#spec.budget(#b));
        }
    }
    match &args.breaker {
        None => {}
        Some(BreakerArg::Static(e)) => {
            let k = local("__retries_breaker");
            lets.push(borrowed(e, &k, &quote!(#krate::__private::breaker)));
            spec = quote!(#spec.breaker(#k));
        }
        Some(BreakerArg::Inline {
            threshold,
            open_for,
            probes,
        }) => {
            let k = inline_breaker(threshold, open_for.as_ref(), probes.as_ref(), krate);
            spec = quote!(#spec.breaker(#k));
        }
    }
    if let Some(e) = &args.concurrency {
        let l = local("__retries_concurrency");
        lets.push(borrowed(e, &l, &quote!(#krate::__private::concurrency)));
        spec = quote!(#spec.concurrency(#l));
    }
    if let Some(e) = &args.rate_limit {
        let r = local("__retries_rate_limit");
        lets.push(borrowed(e, &r, &quote!(#krate::__private::rate_limit)));
        spec = quote!(#spec.rate_limit(#r));
    }
    if args.nested_own == Some(true) {
        spec = quote!(#spec.nested(#krate::Nested::Own));
    }

    (lets, spec)
}

/// The user's body, once: the fake return edge (a call typed by the
/// return type, never made) fixes the block's output to the declared
/// return type before the body is checked, so `return` and `?`
/// coerce as they would in the function itself; the attempt binding reads
/// `attempt`.
fn wrapped(
    args: &Args,
    krate: &Path,
    ret: &syn::Type,
    ret_span: Span,
    block: &syn::Block,
    attempt: &Ident,
) -> TokenStream {
    let binding = args
        .attempt
        .as_ref()
        // A name the user writes with a leading `_` says it is unused on
        // purpose; clippy's pedantic `no_effect_underscore_binding` would
        // still flag the binding made of it.
        .map(|at| {
            quote!(#[allow(clippy::no_effect_underscore_binding)] let #at: &#krate::Attempt = &#attempt;)
        });
    let braces = rebraced(block);
    // A call typed by the return type, not a local of it bound to a
    // `loop {}`: no loop and no drop of a local in every body's MIR (1.1 %
    // of rustc's instructions for 200 functions).
    quote_spanned! {ret_span=>
        if false {
            return #krate::__private::fake_return::<#ret>();
        }
        #binding
        #braces
    }
}

/// The local holding the loop's result, and the function's return value
/// made of it: `finish`, or `recover` (awaited unless the fn is blocking).
/// Errors about the return value (no `From<Stopped>`, a `recover` of the
/// wrong type) point at the return type or at `recover`.
fn finish(
    args: &Args,
    krate: &Path,
    ret: &syn::Type,
    ret_span: Span,
    blocking: bool,
) -> (Ident, TokenStream) {
    match &args.recover {
        None => {
            let r = Ident::new("__retries_result", Span::mixed_site().located_at(ret_span));
            let finish = quote_spanned!(ret_span=> #krate::__private::finish::<#ret>(#r));
            (r, finish)
        }
        Some(e) => {
            let r = Ident::new("__retries_result", Span::mixed_site().located_at(e.span()));
            let recover = if blocking {
                quote_spanned!(e.span()=> #krate::__private::recover_blocking::<#ret, _>(#r, #e))
            } else {
                quote_spanned!(e.span()=> #krate::__private::recover::<#ret, _, _>(#r, #e).await)
            };
            (r, recover)
        }
    }
}

pub(crate) fn generate(f: &ItemFn, args: &Args, krate: &Path) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
        ..
    } = f;
    let (inner_attrs, attrs) = split_attrs(attrs);
    let ReturnType::Type(_, ret) = &sig.output else {
        unreachable!("item::check() requires a return type")
    };
    let ret_span = ret.span();
    let ret_type = ret;
    let ret = item::inferable(ret);
    let (policy_local, spec_local, attempt_local) = (
        local("__retries_policy"),
        local("__retries_spec"),
        local("__retries_attempt"),
    );
    let policy = policy(args, krate, &sig.generics);

    let (lets, spec) = spec(
        args,
        krate,
        &ret,
        &item::concrete(ret_type),
        ret_span,
        &policy_local,
        sig,
    );

    // The body, wrapped once. An `async fn`'s body becomes an `async` block,
    // a blocking fn's the body of a closure; a hedged fn's an `async move`
    // block per copy, owning a copy of its attempt context.
    let blocking = sig.asyncness.is_none();
    if let Some((n, delay, span)) = &args.hedge {
        let snap = local("__retries_snapshot");
        let inner = wrapped(args, krate, &ret, ret_span, block, &snap);
        let n = tokens(n);
        let hedging = match delay {
            crate::ast::HedgeDelay::Fixed(delay) => {
                let delay = duration(delay, krate);
                quote_spanned!(*span=> #krate::Hedging::new(#n, #delay))
            }
            crate::ast::HedgeDelay::Learned(e) => {
                quote_spanned!(e.span()=> #krate::Hedging::learned(#n, &#e))
            }
        };
        let (r, finish) = finish(args, krate, &ret, ret_span, false);
        return quote! {
            #(#attrs)*
            #vis #sig {
                #(#inner_attrs)*
                let #policy_local: &#krate::Policy = #policy;
                #(#lets)*
                let #spec_local = #spec;
                let #r = #spec_local
                    .outcome_hedged(#hedging, |#attempt_local: &#krate::Attempt| {
                        let #snap = #krate::__private::snapshot(#attempt_local);
                        async move { #inner }
                    })
                    .await;
                #finish
            }
        };
    }
    let inner = wrapped(args, krate, &ret, ret_span, block, &attempt_local);
    let body = if blocking {
        // The driver calls it as the body of a closure, once per attempt.
        quote_spanned!(ret_span=> { #inner })
    } else {
        quote_spanned!(ret_span=> async { #inner })
    };
    let (result_local, result) = finish(args, krate, &ret, ret_span, blocking);
    let driver = if blocking {
        quote!(drive_blocking)
    } else {
        quote!(drive)
    };
    // The body's attempt is bound by the loop only when the body names it
    // or the loop needs it (`reconcile`, a blocking fn's driver); the loop
    // of the rest makes each attempt in one call (`Engine::turn`).
    let plain = !blocking && args.reconcile.is_none() && args.attempt.is_none();
    let closure = if plain {
        quote!(#body)
    } else {
        quote!(|#attempt_local| #body)
    };
    let variant = loop_form(args, blocking, plain);
    quote! {
        #(#attrs)*
        #vis #sig {
            #(#inner_attrs)*
            let #policy_local: &#krate::Policy = #policy;
            #(#lets)*
            let #spec_local = #spec;
            let #result_local = #krate::__private::#driver!(#variant #spec_local, #ret, #closure);
            #result
        }
    }
}

/// The loop without the steps this function cannot take (no slot or start
/// to wait for without `concurrency` or `rate_limit`, no look-up without
/// `reconcile`), awaiting one future a turn; `plain`: the body names no
/// attempt and nothing is reconciled (the loop's shortest form).
fn loop_form(args: &Args, blocking: bool, plain: bool) -> TokenStream {
    if blocking {
        return quote!();
    }
    let slot = if args.concurrency.is_some() || args.rate_limit.is_some() {
        quote!(limit)
    } else {
        quote!(unlimited)
    };
    let lookup = if args.reconcile.is_some() {
        quote!(reconcile)
    } else {
        quote!(no_reconcile)
    };
    if plain {
        quote!(@turn[#slot])
    } else {
        quote!(@turn[#slot][#lookup])
    }
}
