//! `#[derive(Classify)]`: every variant classified explicitly or delegated to a
//! field, so the classification is exhaustive by construction.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Attribute, Data, DeriveInput, Error, Fields, Ident, Path};

use crate::diag::Errors;

/// How one variant (or the struct) is classified.
enum Rule {
    /// A constructor of `Verdict`, then a marker method, if any.
    Kind(&'static str, Option<&'static str>, Span),
    /// Delegate to the field at this index.
    Delegate(usize),
}

struct Parsed {
    rule: Option<Rule>,
    krate: Option<Path>,
    /// An attribute was malformed (already reported).
    bad: bool,
}

/// The names `#[classify(...)]` takes: the `Verdict` constructor, and the
/// marker method applied to it (`overloaded`: a refusal that says the
/// service is overloaded, what an `Admission` learns from; `conflict`: lost
/// to concurrent work, retried without drawing on the budget).
const KINDS: &[(&str, &str, Option<&str>)] = &[
    ("not_executed", "not_executed", None),
    ("unknown", "unknown", None),
    ("permanent", "permanent", None),
    ("server_refused", "server_refused", None),
    ("overloaded", "not_executed", Some("with_overload")),
    ("conflict", "not_executed", Some("with_conflict")),
];

/// Read `#[classify(...)]` attributes on a variant or container.
fn parse_attrs(attrs: &[Attribute], container: bool, errors: &mut Errors) -> Parsed {
    let mut out = Parsed {
        rule: None,
        krate: None,
        bad: false,
    };
    for attr in attrs.iter().filter(|a| a.path().is_ident("classify")) {
        let r = attr.parse_nested_meta(|meta| {
            let name = meta
                .path
                .get_ident()
                .map(ToString::to_string)
                .unwrap_or_default();
            if container && name == "crate" {
                let s: syn::LitStr = meta.value()?.parse()?;
                out.krate = Some(s.parse()?);
                return Ok(());
            }
            let rule = if name == "transparent" {
                Rule::Delegate(usize::MAX)
            } else if let Some((_, k, marker)) = KINDS.iter().find(|(n, _, _)| *n == name) {
                Rule::Kind(k, *marker, meta.path.span())
            } else {
                return Err(meta.error(format_args!(
                    "unknown classification `{name}`: use `not_executed`, `unknown`, `permanent`, `server_refused`, `overloaded`, `conflict` or `transparent`"
                )));
            };
            if out.rule.is_some() {
                return Err(meta.error("classified twice: give one classification"));
            }
            out.rule = Some(rule);
            Ok(())
        });
        if let Err(e) = r {
            errors.push(e);
            out.bad = true;
        }
    }
    out
}

fn has_from(field: &syn::Field) -> bool {
    field.attrs.iter().any(|a| a.path().is_ident("from"))
}

fn is_retry_after(field: &syn::Field, errors: &mut Errors) -> bool {
    let mut found = false;
    for attr in field.attrs.iter().filter(|a| a.path().is_ident("classify")) {
        let r = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("retry_after") {
                found = true;
                Ok(())
            } else {
                Err(meta.error("on a field, `#[classify(...)]` takes only `retry_after`"))
            }
        });
        if let Err(e) = r {
            errors.push(e);
        }
    }
    found
}

/// What every arm needs: the crate path, the bounds collected for delegated
/// field types, and the errors.
struct Ctx {
    krate: Path,
    bounds: Vec<TokenStream>,
    errors: Errors,
}

/// The arm's pattern and body for one set of fields.
fn arm(
    cx: &mut Ctx,
    path: &TokenStream,
    fields: &Fields,
    rule: Option<Rule>,
    (name_span, what): (Span, &str),
) -> TokenStream {
    let Ctx {
        krate,
        bounds,
        errors,
    } = cx;
    let retry_after: Vec<usize> = fields
        .iter()
        .enumerate()
        .filter(|(_, f)| is_retry_after(f, errors))
        .map(|(i, _)| i)
        .collect();
    if retry_after.len() > 1 {
        errors.at(
            name_span,
            format_args!("{what} has more than one `#[classify(retry_after)]` field"),
        );
    }
    let rule = rule.or_else(|| {
        let from: Vec<usize> = fields
            .iter()
            .enumerate()
            .filter(|(_, f)| has_from(f))
            .map(|(i, _)| i)
            .collect();
        (from.len() == 1).then(|| Rule::Delegate(from[0]))
    });
    let Some(rule) = rule else {
        errors.at(
            name_span,
            format_args!(
                "{what} is not classified: add `#[classify(not_executed)]`, `#[classify(unknown)]` or `#[classify(permanent)]`, or `#[classify(transparent)]` to use its field's own classification"
            ),
        );
        return quote!(#path { .. } => ::core::unreachable!());
    };
    let rule = match rule {
        Rule::Delegate(usize::MAX) => {
            if fields.len() == 1 {
                Rule::Delegate(0)
            } else {
                errors.at(
                    name_span,
                    format_args!(
                        "`#[classify(transparent)]` needs exactly one field, and {what} has {}",
                        fields.len()
                    ),
                );
                return quote!(#path { .. } => ::core::unreachable!());
            }
        }
        r => r,
    };
    let mut wanted: Vec<usize> = retry_after.clone();
    if let Rule::Delegate(i) = rule {
        wanted.push(i);
    }
    let pattern = pattern(path, fields, &wanted);
    let mut verdict = match rule {
        Rule::Kind(k, marker, span) => {
            let k = Ident::new(k, span);
            if let Some(m) = marker {
                let m = Ident::new(m, span);
                quote_spanned!(span=> #krate::Verdict::#k().#m())
            } else {
                quote_spanned!(span=> #krate::Verdict::#k())
            }
        }
        Rule::Delegate(i) => {
            let field = fields.iter().nth(i).expect("index from this list");
            let ty = &field.ty;
            bounds.push(quote!(#ty: #krate::Classify));
            let b = bind(i, fields);
            quote_spanned!(field.span()=> #krate::Classify::classify(#b))
        }
    };
    if let Some(i) = retry_after.first() {
        let b = bind(*i, fields);
        let span = fields.iter().nth(*i).map_or(name_span, |f| f.ty.span());
        verdict = quote_spanned!(span=> #krate::__private::with_retry_after(#verdict, #b));
    }
    quote!(#pattern => #verdict)
}

/// The binding of field `i` in an arm's pattern, spanned on the field so
/// that type errors about it point there.
fn bind(i: usize, fields: &Fields) -> Ident {
    let span = fields
        .iter()
        .nth(i)
        .map_or_else(Span::call_site, |f| f.ty.span());
    format_ident!("__retry_field_{}", i, span = span)
}

/// A pattern for `path` binding the fields in `wanted`.
fn pattern(path: &TokenStream, fields: &Fields, wanted: &[usize]) -> TokenStream {
    match fields {
        Fields::Unit => quote!(#path),
        Fields::Named(named) => {
            let binds = named
                .named
                .iter()
                .enumerate()
                .filter(|(i, _)| wanted.contains(i))
                .map(|(i, f)| {
                    let name = f.ident.as_ref().expect("named field");
                    let b = bind(i, fields);
                    quote!(#name: #b)
                });
            quote!(#path { #(#binds,)* .. })
        }
        Fields::Unnamed(unnamed) => {
            let binds = (0..unnamed.unnamed.len()).map(|i| {
                if wanted.contains(&i) {
                    let b = bind(i, fields);
                    quote!(#b)
                } else {
                    quote!(_)
                }
            });
            quote!(#path ( #(#binds),* ))
        }
    }
}

pub(crate) fn derive(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(i) => i,
        Err(e) => return e.to_compile_error(),
    };
    let mut errors = Errors::default();
    let container = parse_attrs(&input.attrs, true, &mut errors);
    let mut cx = Ctx {
        krate: container
            .krate
            .clone()
            .unwrap_or_else(|| syn::parse_quote!(::retries)),
        bounds: Vec::new(),
        errors,
    };
    let arms: Vec<TokenStream> = match &input.data {
        Data::Enum(e) => {
            if container.rule.is_some() {
                cx.errors.at(
                    span_of(&input.attrs).unwrap_or_else(Span::call_site),
                    "on an enum, classify each variant: `#[classify(...)]` goes on the variants",
                );
            }
            e.variants
                .iter()
                .map(|v| {
                    let parsed = parse_attrs(&v.attrs, false, &mut cx.errors);
                    if parsed.bad {
                        let name = &v.ident;
                        return quote!(Self::#name { .. } => ::core::unreachable!());
                    }
                    let name = &v.ident;
                    let what = format!("variant `{name}`");
                    arm(
                        &mut cx,
                        &quote!(Self::#name),
                        &v.fields,
                        parsed.rule,
                        (name.span(), &what),
                    )
                })
                .collect()
        }
        Data::Struct(s) => {
            let what = format!("struct `{}`", input.ident);
            vec![arm(
                &mut cx,
                &quote!(Self),
                &s.fields,
                container.rule,
                (input.ident.span(), &what),
            )]
        }
        Data::Union(u) => {
            cx.errors.push(Error::new(
                u.union_token.span,
                "`#[derive(Classify)]` supports enums and structs, not unions",
            ));
            Vec::new()
        }
    };
    let Ctx {
        krate,
        bounds,
        errors,
    } = cx;
    let name = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let mut predicates: Vec<TokenStream> = where_clause
        .map(|w| w.predicates.iter().map(|p| quote!(#p)).collect())
        .unwrap_or_default();
    if !input.generics.params.is_empty() {
        predicates.extend(bounds);
    }
    let errs = errors.into_tokens();
    quote! {
        #errs
        impl #impl_generics #krate::Classify for #name #ty_generics where #(#predicates,)* {
            fn classify(&self) -> #krate::Verdict {
                #[allow(unreachable_code)]
                match self {
                    #(#arms,)*
                }
            }
        }
    }
}

fn span_of(attrs: &[Attribute]) -> Option<Span> {
    attrs
        .iter()
        .find(|a| a.path().is_ident("classify"))
        .map(Spanned::span)
}
