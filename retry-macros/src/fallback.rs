//! What is emitted on error: the function as written, so that the rest of
//! the crate (and the IDE) keeps working and no error follows from the missing
//! expansion.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{ItemFn, Path};

use crate::ast::Args;
use crate::item::{rebraced, split_attrs};

/// On any error: the function as written, so the rest of the crate (and the
/// IDE) keeps working, and no error follows from the missing expansion. The
/// attempt binding, if any, is declared so the body type-checks.
pub(crate) fn fallback(f: &ItemFn, args: &Args, krate: &Path, shape_ok: bool) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
        ..
    } = f;
    if let (Some(at), true) = (&args.attempt, shape_ok) {
        let body = rebraced(block);
        let (inner_attrs, attrs) = split_attrs(attrs);
        quote! {
            #(#attrs)*
            #[allow(unreachable_code, unused_variables)]
            #vis #sig {
                #(#inner_attrs)*
                let #at: &#krate::Attempt = ::core::unreachable!();
                #body
            }
        }
    } else {
        quote!(#f)
    }
}
