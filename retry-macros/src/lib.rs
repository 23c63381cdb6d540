//! Implementation detail of the [`retries`](https://docs.rs/retries) crate: the
//! `#[retryable]` attribute and `#[derive(Classify)]`. Depend on `retries`, not
//! on this crate; its version is pinned by `retries`.
//!
//! This crate only reads the attribute and forwards what it says. Its files
//! form a DAG, bottom up: `ast.rs` (the parsed values and `KEYS`),
//! `duration.rs`, `diag.rs` (error collection and hints), `lit.rs` (the form
//! of literal values), `args.rs` (one setter per key), `valid.rs` (keys that
//! must or cannot go together), `item.rs` (the annotated fn), `expand.rs`
//! (the thin expansion), `fallback.rs` (what is emitted on error),
//! `impl_block.rs` (an annotated `impl` block, method by method),
//! `classify.rs` (the derive); this file holds the entry points and the
//! dispatch between a function and an `impl` block. Every default and every
//! rule about values lives in `retries-core`.

mod args;
mod ast;
mod classify;
mod diag;
mod duration;
mod expand;
mod fallback;
#[cfg(test)]
mod fuzz;
mod impl_block;
mod item;
mod lit;
mod valid;

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::quote;

use crate::diag::Errors;

// The attribute's user docs, one section per key: `retryable.md`, beside
// this file (its examples run as the facade's doctests: see `Cargo.toml`).
#[doc = include_str!("retryable.md")]
#[proc_macro_attribute]
pub fn retryable(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand_tokens(attr.into(), item.into()).into()
}

/// Derive `retries::Classify` for an error enum (or struct): every variant is
/// classified explicitly, so the classification is exhaustive by construction
/// (a variant left out is a compile error).
///
/// * `#[classify(not_executed)]`, `#[classify(unknown)]`,
///   `#[classify(permanent)]`, `#[classify(server_refused)]` on a variant;
/// * `#[classify(overloaded)]`: not executed, refused by a service that says
///   it is overloaded (an HTTP 429, a `RESOURCE_EXHAUSTED`): what an
///   `Admission` learns from (`Verdict::with_overload`); a variant marked
///   only `not_executed` teaches it nothing;
/// * `#[classify(conflict)]`: not executed, lost to concurrent work (a
///   serialization failure, an optimistic-lock miss): retried without
///   drawing on the budget (`Verdict::with_conflict`);
/// * `#[classify(transparent)]` on a one-field variant delegates to that
///   field's own `Classify`; so does a variant whose single `#[from]` field
///   (thiserror's attribute) is the only candidate;
/// * `#[classify(retry_after)]` on a field of type `Duration` or
///   `Option<Duration>` attaches the server's requested pause;
/// * `#[classify(crate = "::my_retries")]` on the type when `retries` is renamed.
///
#[doc = include_str!("classify.md")]
#[proc_macro_derive(Classify, attributes(classify))]
pub fn derive_classify(input: TokenStream) -> TokenStream {
    classify::derive(input.into()).into()
}

// The dispatch: a function or an `impl` block; for a function, parse, check,
// then expand or fall back.

/// Expand `#[retryable(args)] f` (or an `impl` block), or emit the errors
/// and a fallback.
fn expand_tokens(attr: TokenStream2, item: TokenStream2) -> TokenStream2 {
    if is_impl(&item)
        && let Ok(block) = syn::parse2::<syn::ItemImpl>(item.clone())
    {
        return crate::impl_block::expand(attr, block);
    }
    retryable_at(attr, item, Span::call_site())
}

/// Is `item` an `impl` block? Its first word after its attributes (and
/// `unsafe` or `default`) says so; a function's is `pub`, `async`, `fn`, …
/// (its return type may hold `impl`, never first). Read from the tokens: a
/// whole parse as a `syn::Item` first was ~30 % of the attribute's run
/// on every function (callgrind over rustc, 200 functions).
fn is_impl(item: &TokenStream2) -> bool {
    use proc_macro2::TokenTree;
    let mut tokens = item.clone().into_iter();
    while let Some(t) = tokens.next() {
        match t {
            // An attribute: `#` and its bracketed group.
            TokenTree::Punct(p) if p.as_char() == '#' => {
                tokens.next();
            }
            TokenTree::Ident(i) if i == "unsafe" || i == "default" => {}
            TokenTree::Ident(i) => return i == "impl",
            _ => return false,
        }
    }
    false
}

/// [`expand_tokens`] for one function, missing keys reported at `site`.
pub(crate) fn retryable_at(attr: TokenStream2, item: TokenStream2, site: Span) -> TokenStream2 {
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
    let at_named = item::check_attempt_name(&f, args.attempt.as_ref(), &mut errors);
    crate::valid::validate(&args, &mut errors, site);
    if f.sig.asyncness.is_none() {
        crate::valid::blocking(&args, &mut errors);
    }
    let krate = args
        .krate
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(::retries));
    if !shape_ok || !errors.is_empty() {
        let fallback = fallback::fallback(&f, &args, &krate, shape_ok && at_named);
        let errors = errors.into_tokens();
        return quote!(#errors #fallback);
    }
    expand::generate(&f, &args, &krate)
}
