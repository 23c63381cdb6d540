//! The annotated item: an `async fn` or a blocking `fn` returning a
//! `Result`, checked for the shapes `#[retryable]` cannot wrap.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Item, ItemFn, ReturnType, Type};

use crate::diag::Errors;

/// Parse the item. `Err` carries the tokens to emit unchanged (with the errors
/// already recorded).
///
/// A function is read without parsing its body (see [`Light`]); anything
/// that does not read so is parsed again as a whole item, for the errors.
pub(crate) fn parse(item: TokenStream, errors: &mut Errors) -> Result<ItemFn, TokenStream> {
    if let Ok(Light(f)) = syn::parse2::<Light>(item.clone()) {
        return Ok(f);
    }
    match syn::parse2::<Item>(item.clone()) {
        Ok(Item::Fn(f)) => Ok(f),
        Ok(other) => {
            errors.at(
                other.span(),
                "`#[retryable]` applies to a function (`async` or blocking; free, a method, or a trait method with a body) or to an `impl` block",
            );
            Err(item)
        }
        Err(_) => {
            // A trait method without a body does not parse as an item.
            errors.at(
                item.span(),
                "`#[retryable]` applies to an `async fn` with a body; on a trait method, put it on the method's default body or on each impl",
            );
            Err(item)
        }
    }
}

/// A function whose body is kept as its tokens: the expansion emits the
/// body as written and reads nothing in it, so its statements are not
/// parsed (parsing them, and printing them again, cost 0.08 G of rustc's
/// 11.41 G instructions for 200 short functions, in a proc macro that a
/// debug build compiles without optimization). The body's inner
/// attributes are read, as a whole parse reads them (into `attrs`).
struct Light(ItemFn);

impl syn::parse::Parse for Light {
    fn parse(input: syn::parse::ParseStream<'_>) -> syn::Result<Self> {
        let mut attrs = input.call(syn::Attribute::parse_outer)?;
        let vis: syn::Visibility = input.parse()?;
        let sig: syn::Signature = input.parse()?;
        let content;
        let brace_token = syn::braced!(content in input);
        attrs.extend(content.call(syn::Attribute::parse_inner)?);
        let body: TokenStream = content.parse()?;
        Ok(Self(ItemFn {
            attrs,
            vis,
            modifiers: syn::FnModifiers::default(),
            sig,
            block: Box::new(syn::Block {
                brace_token,
                stmts: vec![syn::Stmt::Item(Item::Verbatim(body))],
            }),
        }))
    }
}

/// The shape checks: not `const`, not rewritten by `#[async_trait]`, returns a
/// `Result`. Returns `false`
/// when the function cannot be expanded.
pub(crate) fn check(f: &ItemFn, errors: &mut Errors) -> bool {
    let sig = &f.sig;
    let mut ok = true;
    if let Some(again) = f.attrs.iter().find(|a| is_retryable(a)) {
        errors.at(
            again.path().segments.last().map_or(again.span(), |s| s.ident.span()),
            "`#[retryable]` is applied twice to this function: one attribute describes its retries (merge the keys into one; to nest retry loops, call one retried function from another)",
        );
        ok = false;
    }
    if let Some(c) = &sig.constness {
        errors.at(
            c.span,
            "`#[retryable]` cannot be applied to a `const fn`: a retry loop waits on a clock, which a `const fn` cannot do",
        );
        ok = false;
    }
    if sig.asyncness.is_none() && sig.constness.is_none() && returns_boxed_future(&sig.output) {
        errors.at(
            sig.fn_token.span,
            "`#[retryable]` cannot wrap a method already rewritten by `#[async_trait]`\n\
             = help: native `async fn` in traits works with `#[retryable]` (drop `#[async_trait]` if the trait need not be `dyn`)\n\
             = help: or put `#[retryable]` on an inherent `async fn` and call it from the trait method",
        );
        ok = false;
    }
    match &sig.output {
        ReturnType::Default => {
            errors.at(
                sig.paren_token.span.join(),
                "`#[retryable]` functions must return a `Result`: add a return type such as `-> Result<(), MyError>`",
            );
            ok = false;
        }
        ReturnType::Type(_, ty) if sig.asyncness.is_none() && returns_impl_future(ty) => {
            errors.at(
                ty.span(),
                "`#[retryable]` runs the body once per attempt: write this as an `async fn` returning the `Result`, not a `fn` returning `impl Future` (a blocking `fn` returns the `Result` itself)",
            );
            ok = false;
        }
        ReturnType::Type(_, ty) if obviously_not_result(ty) => {
            errors.at(
                ty.span(),
                format_args!(
                    "`#[retryable]` functions must return a `Result`, not `{}`: a retry loop needs failures to classify",
                    ty.to_token_stream()
                ),
            );
            ok = false;
        }
        ReturnType::Type(..) => {}
    }
    ok
}

/// Is this attribute `#[retryable(…)]` (under any path ending in `retryable`)?
pub(crate) fn is_retryable(attr: &syn::Attribute) -> bool {
    attr.path()
        .segments
        .last()
        .is_some_and(|s| s.ident == "retryable")
}

/// `attempt = name` must not hide a parameter of the same name in the body
/// (rustc would then report type errors far from the cause). `false` when
/// it would.
pub(crate) fn check_attempt_name(f: &ItemFn, at: Option<&syn::Ident>, errors: &mut Errors) -> bool {
    let Some(at) = at else { return true };
    let mut bound = Vec::new();
    for input in &f.sig.inputs {
        if let syn::FnArg::Typed(t) = input {
            bindings(&t.pat, &mut bound);
        }
    }
    if bound.contains(&at) {
        let other = if bound.iter().any(|b| *b == "at") {
            "attempt"
        } else {
            "at"
        };
        errors.at(
            at.span(),
            format_args!(
                "`attempt = {at}` would hide the parameter `{at}` in the body: give the attempt context another name, e.g. `attempt = {other}`"
            ),
        );
        return false;
    }
    true
}

/// The names a parameter pattern binds.
fn bindings<'p>(pat: &'p syn::Pat, out: &mut Vec<&'p syn::Ident>) {
    use syn::Pat;
    match pat {
        Pat::Ident(p) => {
            out.push(&p.ident);
            if let Some((_, sub)) = &p.subpat {
                bindings(sub, out);
            }
        }
        Pat::Tuple(p) => p.elems.iter().for_each(|e| bindings(e, out)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| bindings(e, out)),
        Pat::Struct(p) => p.fields.iter().for_each(|f| bindings(&f.pat, out)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| bindings(e, out)),
        Pat::Or(p) => p.cases.iter().for_each(|e| bindings(e, out)),
        Pat::Reference(p) => bindings(&p.pat, out),
        Pat::Paren(p) => bindings(&p.pat, out),
        Pat::Type(p) => bindings(&p.pat, out),
        _ => {}
    }
}

/// Types that can never be a `Result` (a path type may be an alias, and is
/// left to the trait check in the expansion).
pub(crate) fn obviously_not_result(ty: &Type) -> bool {
    const NOT: &[&str] = &[
        "bool", "char", "str", "String", "Option", "Vec", "u8", "u16", "u32", "u64", "u128",
        "usize", "i8", "i16", "i32", "i64", "i128", "isize", "f32", "f64", "Box",
    ];
    match ty {
        Type::Tuple(_)
        | Type::Reference(_)
        | Type::Array(_)
        | Type::Slice(_)
        | Type::ImplTrait(_)
        | Type::Never(_)
        | Type::Ptr(_)
        | Type::FnPtr(_)
        | Type::TraitObject(_) => true,
        Type::Paren(p) => obviously_not_result(&p.elem),
        Type::Path(p) => p
            .path
            .segments
            .last()
            .is_some_and(|s| NOT.contains(&s.ident.to_string().as_str())),
        _ => false,
    }
}

/// `impl Future<…>` (written in place of `async fn`).
fn returns_impl_future(ty: &Type) -> bool {
    let Type::ImplTrait(t) = ty else {
        return false;
    };
    t.bounds.iter().any(|b| {
        matches!(b, syn::TypeParamBound::Trait(t)
            if t.path.segments.last().is_some_and(|s| s.ident == "Future"))
    })
}

fn returns_boxed_future(output: &ReturnType) -> bool {
    let ReturnType::Type(_, ty) = output else {
        return false;
    };
    let text = ty.to_token_stream().to_string().replace(' ', "");
    text.contains("Pin<Box<dyn") && text.contains("Future")
}

/// The return type with every `impl Trait` replaced by `_`, usable as a
/// turbofish argument inside the body.
pub(crate) fn inferable(ty: &Type) -> Type {
    replace_impl_trait(ty, |i| {
        Type::Infer(syn::TypeInfer {
            attrs: Vec::new(),
            underscore_token: syn::Token![_](i.impl_token.span),
        })
    })
}

/// The return type with every `impl Trait` replaced by `()`: a concrete type
/// from which the error type can be projected (`<R as IsResult>::Err`) when
/// nothing else fixes the success type, as in `Result<impl Display, E>`.
pub(crate) fn concrete(ty: &Type) -> Type {
    replace_impl_trait(ty, |i| {
        Type::Tuple(syn::TypeTuple {
            attrs: Vec::new(),
            paren_token: syn::token::Paren(i.impl_token.span),
            elems: syn::punctuated::Punctuated::new(),
        })
    })
}

fn replace_impl_trait(ty: &Type, with: fn(&syn::TypeImplTrait) -> Type) -> Type {
    struct Replace(fn(&syn::TypeImplTrait) -> Type);
    impl VisitMut for Replace {
        fn visit_type_mut(&mut self, t: &mut Type) {
            if let Type::ImplTrait(i) = t {
                *t = (self.0)(i);
                return;
            }
            syn::visit_mut::visit_type_mut(self, t);
        }
    }
    let mut ty = ty.clone();
    Replace(with).visit_type_mut(&mut ty);
    ty
}

/// The function's attributes as (inner, outer): syn keeps the body's inner
/// attributes (`#![allow(…)]`) with the outer ones; they go back to the top
/// of the generated body, where they apply to all of it.
pub(crate) fn split_attrs(
    attrs: &[syn::Attribute],
) -> (Vec<&syn::Attribute>, Vec<&syn::Attribute>) {
    attrs
        .iter()
        .partition(|a| matches!(a.style, syn::AttrStyle::Inner(_)))
}

/// The user's body with its braces re-made with the expansion's hygiene at
/// the same place: as the tail of a block the expansion makes, the user's
/// own braces would make rustc's `unused_braces` lint fire on a one-line
/// body (`{ Ok(()) }`), in the user's code. Errors still point at the body.
pub(crate) fn rebraced(block: &syn::Block) -> proc_macro2::Group {
    let stmts = &block.stmts;
    let mut braces = proc_macro2::Group::new(proc_macro2::Delimiter::Brace, quote!(#(#stmts)*));
    braces.set_span(Span::mixed_site().located_at(block.brace_token.span.join()));
    braces
}
