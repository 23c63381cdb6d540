//! `#[retryable(...)]` on an `impl` block: its keys are the defaults of every
//! `async fn` in it (and of any method with its own `#[retryable(...)]`,
//! whose keys override them key by key); `#[retryable(skip)]` opts a method
//! out; other methods are left alone (an `async fn` returning no `Result`
//! is an error asking for `skip`). Each method is then expanded as a
//! single annotated function would be, the block's `attempt` binding only
//! where the body uses it. Methods that set no `budget` share one token
//! bucket, made for the block.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Expr, Ident, ImplItem, ItemImpl, Token};

use crate::diag::Errors;
use crate::item::is_retryable;

/// One key as written: its name and its tokens (`name`, `name = value` or
/// `name(…)`).
#[derive(Clone)]
struct Entry {
    name: String,
    tokens: TokenStream,
}

/// Split an attribute into its keys, without judging them (that is the
/// single-function expansion's job, on the merged list).
fn entries(tokens: TokenStream) -> syn::Result<Vec<Entry>> {
    let parser = |input: ParseStream<'_>| -> syn::Result<Vec<Entry>> {
        let mut out = Vec::new();
        while !input.is_empty() {
            let key = input.call(Ident::parse_any)?;
            let mut tokens = quote!(#key);
            if input.peek(syn::token::Paren) {
                let group: proc_macro2::Group = input.parse()?;
                tokens.extend(quote!(#group));
            } else if input.peek(Token![=]) {
                let eq: Token![=] = input.parse()?;
                let value: Expr = input.parse()?;
                tokens.extend(quote!(#eq #value));
            }
            out.push(Entry {
                name: key.to_string(),
                tokens,
            });
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(out)
    };
    parser.parse2(tokens)
}

/// An `async fn` that returns nothing, or a type that is never a `Result`.
fn not_a_result(sig: &syn::Signature) -> bool {
    sig.asyncness.is_some()
        && match &sig.output {
            syn::ReturnType::Default => true,
            syn::ReturnType::Type(_, ty) => crate::item::obviously_not_result(ty),
        }
}

/// Where a signature's return type is (or would be).
fn return_span(sig: &syn::Signature) -> Span {
    match &sig.output {
        syn::ReturnType::Default => sig.paren_token.span.join(),
        syn::ReturnType::Type(_, ty) => syn::spanned::Spanned::span(&**ty),
    }
}

/// The method's own keys, its `#[retryable(...)]` removed: `None` for a
/// method the block leaves alone (blocking, and not annotated); no keys for
/// an `async fn` without an attribute of its own.
fn take_own(method: &mut syn::ImplItemFn) -> Option<syn::Result<Vec<Entry>>> {
    match method.attrs.iter().position(is_retryable) {
        Some(i) => {
            let attr = method.attrs.remove(i);
            Some(match &attr.meta {
                syn::Meta::List(list) => entries(list.tokens.clone()),
                _ => Ok(Vec::new()),
            })
        }
        None if method.sig.asyncness.is_some() => Some(Ok(Vec::new())),
        None => None,
    }
}

/// The block's keys, then the method's in their place or after: a key the
/// method gives replaces the block's.
fn merge(block: &[Entry], method: Vec<Entry>) -> TokenStream {
    let mut merged: Vec<TokenStream> = block
        .iter()
        .filter(|b| !method.iter().any(|m| m.name == b.name))
        .map(|b| b.tokens.clone())
        .collect();
    merged.extend(method.into_iter().map(|m| m.tokens));
    quote!(#(#merged),*)
}

/// Expand `#[retryable(attr)] impl … { … }`.
pub(crate) fn expand(attr: TokenStream, mut block: ItemImpl) -> TokenStream {
    let mut errors = Errors::default();
    let defaults = match entries(attr.clone()) {
        Ok(e) => e,
        Err(e) => {
            errors.push(e);
            return quote!(#block);
        }
    };
    if let Some(skip) = defaults.iter().find(|e| e.name == "skip") {
        errors.at(
            span_of(&skip.tokens),
            "`skip` opts a method out of its block's `#[retryable]`: put `#[retryable(skip)]` on the method, not on the block",
        );
    }
    // The block's keys alone, checked once for what does not depend on the
    // method (unknown keys, malformed values), so such an error is reported
    // once, not once per method.
    let mut key_errors = Errors::default();
    let _ = crate::args::parse(attr, &mut key_errors);
    if !errors.is_empty() || !key_errors.is_empty() {
        errors.push_all(key_errors);
        let errors = errors.into_tokens();
        fallback_methods(&mut block, &defaults);
        return quote!(#errors #block);
    }
    let shared_budget = !defaults.iter().any(|e| e.name == "budget");
    let budget = Ident::new("__RETRIES_IMPL_BUDGET", Span::mixed_site());
    let mut any_shared = false;
    let mut out_errors = Errors::default();
    for item in &mut block.items {
        let ImplItem::Fn(method) = item else { continue };
        if !method.attrs.iter().any(is_retryable) && not_a_result(&method.sig) {
            // Taken in only because it is an `async fn` of the block.
            out_errors.at(
                return_span(&method.sig),
                "this `async fn` does not return a `Result`, so its block's `#[retryable]` cannot retry it: return a `Result`, or mark it `#[retryable(skip)]` to leave it as it is",
            );
            continue;
        }
        let own_entries = match take_own(method) {
            Some(Ok(e)) => e,
            Some(Err(e)) => {
                out_errors.push(e);
                continue;
            }
            None => continue, // a blocking method not annotated: left alone
        };
        if let Some(skip) = own_entries.iter().find(|e| e.name == "skip") {
            if own_entries.len() > 1 {
                out_errors.at(
                    span_of(&skip.tokens),
                    "`skip` leaves this method as it is: it takes no other keys",
                );
            }
            continue;
        }
        // The block's `attempt = name` binds the context only in the methods
        // that use it: in the others the binding would be an unused
        // variable, a warning in the user's code.
        let unused_attempt = !own_entries.iter().any(|e| e.name == "attempt")
            && attempt_name(&defaults)
                .is_some_and(|name| !mentions(method.block.to_token_stream(), &name));
        let defaults_here: Vec<Entry> = defaults
            .iter()
            .filter(|e| !(unused_attempt && e.name == "attempt"))
            .cloned()
            .collect();
        let mut merged = merge(&defaults_here, own_entries);
        if shared_budget && !merged_has(&merged, "budget") {
            any_shared = true;
            merged.extend(quote!(, budget = #budget));
        }
        let site = method.sig.ident.span();
        let tokens = quote!(#method);
        let expanded = crate::retryable_at(merged, tokens, site);
        *item = ImplItem::Verbatim(expanded);
    }
    let errors = out_errors.into_tokens();
    if !any_shared {
        return quote!(#errors #block);
    }
    let krate = crate_path(&defaults).unwrap_or_else(|| quote!(::retries));
    quote! {
        #errors
        // One budget for the block's methods that set none (a token bucket
        // with the default settings), declared beside the block.
        const _: () = {
            static #budget: #krate::TokenBucket = #krate::TokenBucket::DEFAULT;
            #block
        };
    }
}

/// On an error in the block's keys (reported once): every method that would
/// have been expanded is emitted as written, with its attempt binding
/// declared, so no error follows from the missing expansion.
fn fallback_methods(block: &mut ItemImpl, defaults: &[Entry]) {
    for item in &mut block.items {
        let ImplItem::Fn(method) = item else { continue };
        let Some(own) = take_own(method) else {
            continue;
        };
        let own = own.unwrap_or_default();
        if own.iter().any(|e| e.name == "skip") {
            continue;
        }
        let merged = merge(defaults, own);
        let args = crate::args::parse(merged, &mut Errors::default());
        let Ok(f) = syn::parse2::<syn::ItemFn>(quote!(#method)) else {
            continue;
        };
        let krate = args
            .krate
            .clone()
            .unwrap_or_else(|| syn::parse_quote!(::retries));
        *item = ImplItem::Verbatim(crate::fallback::fallback(&f, &args, &krate, true));
    }
}

/// The name the block's `attempt = name` binds, if it has that key.
fn attempt_name(defaults: &[Entry]) -> Option<String> {
    value_of::<Ident>(defaults, "attempt").map(|i| i.to_string())
}

/// The value of the block's `key = value`, if it has that key and the value
/// parses as a `T`.
fn value_of<T: syn::parse::Parse>(defaults: &[Entry], key: &str) -> Option<T> {
    let entry = defaults.iter().find(|e| e.name == key)?;
    let parser = |input: ParseStream<'_>| -> syn::Result<T> {
        let _ = input.call(Ident::parse_any)?;
        input.parse::<Token![=]>()?;
        input.parse()
    };
    parser.parse2(entry.tokens.clone()).ok()
}

/// Do `tokens` use `name`: as an identifier, or inside a literal (a format
/// string's `{name}`)? Erring on the side of yes.
fn mentions(tokens: TokenStream, name: &str) -> bool {
    tokens.into_iter().any(|t| match t {
        proc_macro2::TokenTree::Ident(i) => i == name,
        proc_macro2::TokenTree::Literal(l) => l.to_string().contains(name),
        proc_macro2::TokenTree::Group(g) => mentions(g.stream(), name),
        proc_macro2::TokenTree::Punct(_) => false,
    })
}

/// The `crate = "…"` path of the block's keys, as tokens.
fn crate_path(defaults: &[Entry]) -> Option<TokenStream> {
    let path: syn::Path = value_of::<syn::LitStr>(defaults, "crate")?.parse().ok()?;
    Some(quote!(#path))
}

fn merged_has(tokens: &TokenStream, key: &str) -> bool {
    entries(tokens.clone()).is_ok_and(|e| e.iter().any(|e| e.name == key))
}

fn span_of(tokens: &TokenStream) -> Span {
    tokens
        .clone()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |t| t.span())
}
