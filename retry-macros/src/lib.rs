//! Implementation detail of the [`retry`](https://docs.rs/retry) crate: the
//! `#[retryable]` attribute. Depend on `retry`, not on this crate.

mod args;
mod classify;
mod duration;
mod expand;
#[cfg(test)]
mod fuzz;
mod item;

use proc_macro::TokenStream;

/// Turn an `async fn` into a deadline-bounded retry loop.
#[proc_macro_attribute]
pub fn retryable(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::retryable(attr.into(), item.into()).into()
}

/// Derive `retry::Classify` for an error enum (or struct).
#[proc_macro_derive(Classify, attributes(classify))]
pub fn derive_classify(input: TokenStream) -> TokenStream {
    classify::derive(input.into()).into()
}
