//! Literal values of the keys: what each key accepts as a literal (checked
//! here for its *form*: a duration, a whole number, a known name), or an
//! expression left to rustc. Rules about values live in `retries-core`.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ExprUnary, Ident, Lit, Path, UnOp};

use crate::ast::{BackoffArg, BudgetArg, JitterLit, Kind, Value};
use crate::diag::Errors;
use crate::duration;

/// A whole number (`failure_threshold`, `half_open_probes`).
pub(crate) fn count_value(e: Expr, what: &str, errors: &mut Errors) -> Option<Value<u32>> {
    let Expr::Lit(ExprLit { lit, .. }) = &e else {
        return Some(Value::Expr(e));
    };
    match lit {
        Lit::Int(i) => {
            if let Ok(n) = i.base10_parse::<u32>() {
                return Some(Value::Lit(n, i.span()));
            }
            errors.at(i.span(), format_args!("`{what}` must fit in a `u32`"));
            None
        }
        other => {
            errors.at(other.span(), format_args!("`{what}` is a whole number"));
            None
        }
    }
}

/// Strip the invisible groups `macro_rules!` puts around substituted
/// fragments (`$mode:literal` arrives as `Expr::Group`), so literals passed
/// through a declarative macro are still checked as literals.
pub(crate) fn peel(e: Expr) -> Expr {
    match e {
        Expr::Group(g) => peel(*g.expr),
        other => other,
    }
}

fn str_lit(e: &Expr) -> Option<&syn::LitStr> {
    match e {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Some(s),
        _ => None,
    }
}

pub(crate) fn bool_lit(e: &Expr, errors: &mut Errors) -> Option<(bool, Span)> {
    if let Expr::Lit(ExprLit {
        lit: Lit::Bool(b), ..
    }) = e
    {
        return Some((b.value, b.span));
    }
    errors.at(
        e.span(),
        "`idempotent` must be `true` or `false` (or the bare flag `idempotent`): it is declared, never computed",
    );
    None
}

pub(crate) fn duration_value(e: Expr, errors: &mut Errors) -> Option<Value<u64>> {
    let Some(s) = str_lit(&e) else {
        if let Expr::Lit(ExprLit {
            lit: Lit::Int(_) | Lit::Float(_),
            ..
        }) = &e
        {
            errors.at(
                e.span(),
                "a bare number has no unit: write a duration literal such as \"250ms\" or \"2s\", or a `std::time::Duration` expression",
            );
            return None;
        }
        return Some(Value::Expr(e));
    };
    match duration::parse(&s.value()) {
        Ok(nanos) => Some(Value::Lit(nanos, s.span())),
        Err(why) => {
            errors.at(
                s.span(),
                format_args!("malformed duration {:?}: {why}", s.value()),
            );
            None
        }
    }
}

pub(crate) fn attempts_value(e: Expr, errors: &mut Errors) -> Option<Value<u32>> {
    const FORM: &str =
        "`max_attempts` is a whole number of attempts, the first one included (at least 1)";
    if let Expr::Unary(ExprUnary {
        op: UnOp::Neg(_), ..
    }) = &e
    {
        errors.at(e.span(), FORM);
        return None;
    }
    let Expr::Lit(ExprLit { lit, .. }) = &e else {
        return Some(Value::Expr(e));
    };
    let Lit::Int(i) = lit else {
        errors.at(lit.span(), FORM);
        return None;
    };
    if let Ok(n) = i.base10_parse::<u32>() {
        return Some(Value::Lit(n, i.span()));
    }
    errors.at(i.span(), "`max_attempts` must fit in a `u32`");
    None
}

fn float_lit(e: &Expr) -> Option<(f64, Span)> {
    let (neg, inner) = match e {
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_),
            expr,
            ..
        }) => (true, &**expr),
        other => (false, other),
    };
    let Expr::Lit(ExprLit { lit, .. }) = inner else {
        return None;
    };
    let v = match lit {
        Lit::Float(f) => f.base10_parse::<f64>().ok()?,
        Lit::Int(i) => i.base10_parse::<f64>().ok()?,
        _ => return None,
    };
    Some((if neg { -v } else { v }, e.span()))
}

pub(crate) fn multiplier_value(e: Expr, errors: &mut Errors) -> Option<Value<f64>> {
    match float_lit(&e) {
        Some((m, span)) if !m.is_finite() => {
            errors.at(span, "`multiplier` must be a finite number such as `2.0`");
            None
        }
        Some((m, span)) => Some(Value::Lit(m, span)),
        None if matches!(e, Expr::Lit(_)) => {
            errors.at(e.span(), "`multiplier` is a number such as `2.0`");
            None
        }
        None => Some(Value::Expr(e)),
    }
}

pub(crate) fn jitter_value(e: Expr, errors: &mut Errors) -> Option<Value<JitterLit>> {
    if let Some(s) = str_lit(&e) {
        let j = match s.value().as_str() {
            "none" => JitterLit::None,
            "full" => JitterLit::Full,
            "equal" => JitterLit::Equal,
            "decorrelated" => JitterLit::Decorrelated,
            other => {
                errors.at(
                    s.span(),
                    format_args!(
                        "unknown jitter {other:?}: use \"none\", \"full\", \"equal\", \"decorrelated\", or a factor in [0, 1] for proportional jitter (e.g. `jitter = 0.2`)"
                    ),
                );
                return None;
            }
        };
        return Some(Value::Lit(j, s.span()));
    }
    match float_lit(&e) {
        Some((f, span)) if !f.is_finite() => {
            errors.at(span, "a jitter factor is a number in [0, 1], such as `0.2`");
            None
        }
        Some((f, span)) => Some(Value::Lit(JitterLit::Proportional(f), span)),
        None => Some(Value::Expr(e)),
    }
}

pub(crate) fn backoff_value(e: Expr, errors: &mut Errors) -> Option<BackoffArg> {
    let Some(s) = str_lit(&e) else {
        return Some(BackoffArg::Expr(e));
    };
    let k = match s.value().as_str() {
        "constant" => Kind::Constant,
        "linear" => Kind::Linear,
        "exponential" => Kind::Exponential,
        "decorrelated" => Kind::Decorrelated,
        "grpc" => Kind::Grpc,
        other => {
            errors.at(
                s.span(),
                format_args!(
                    "unknown backoff {other:?}: use \"constant\", \"linear\", \"exponential\", \"decorrelated\" or \"grpc\", or a `retries::Backoff` expression"
                ),
            );
            return None;
        }
    };
    Some(BackoffArg::Kind(k, s.span()))
}

pub(crate) fn ident_value(e: &Expr, errors: &mut Errors) -> Option<Ident> {
    if let Expr::Path(p) = e
        && p.qself.is_none()
        && let Some(id) = p.path.get_ident()
    {
        return Some(id.clone());
    }
    errors.at(
        e.span(),
        "`attempt` names the binding for the attempt context in the body, e.g. `attempt = at`",
    );
    None
}

pub(crate) fn budget_value(e: Expr, errors: &mut Errors) -> Option<BudgetArg> {
    if let Some(s) = str_lit(&e) {
        if s.value() == "none" {
            return Some(BudgetArg::Off(s.span()));
        }
        errors.at(
            s.span(),
            "`budget` is a budget shared by several calls (`budget = PAYMENTS`, `budget = self.budget`) or \"none\"",
        );
        return None;
    }
    Some(BudgetArg::Expr(e))
}

pub(crate) fn nested_value(e: &Expr, errors: &mut Errors) -> Option<bool> {
    match str_lit(e).map(syn::LitStr::value).as_deref() {
        Some("defer") => Some(false),
        Some("own") => Some(true),
        _ => {
            errors.at(
                e.span(),
                "`nested` is \"defer\" (inside another retried call, make one attempt and let the outer loop retry; the default) or \"own\" (retry here too)",
            );
            None
        }
    }
}

pub(crate) fn crate_value(e: &Expr, errors: &mut Errors) -> Option<Path> {
    if let Some(s) = str_lit(e) {
        if let Ok(p) = s.parse::<Path>() {
            return Some(p);
        }
        errors.at(
            s.span(),
            format_args!(
                "{:?} is not a path: write the path of the `retries` crate, e.g. `crate = \"::my_retries\"`",
                s.value()
            ),
        );
        return None;
    }
    errors.at(
        e.span(),
        "`crate` takes the path as a string: `crate = \"::my_retries\"`",
    );
    None
}
