//! Diagnostics: errors collected so every problem of an attribute is reported
//! at once, and the unknown-key message with its hints.

use std::fmt::Write as _;

use proc_macro2::{Span, TokenStream};
use syn::{Error, Ident};

use crate::ast::KEYS;

/// Keys people reach for from other libraries, with the name used here.
const RENAMED: &[(&str, &str)] = &[
    (
        "timeout",
        "use `deadline` (the whole call) or `attempt_timeout` (one attempt)",
    ),
    ("total_timeout", "use `deadline`"),
    (
        "max_retries",
        "use `max_attempts`, which counts the first attempt too",
    ),
    (
        "retries",
        "use `max_attempts`, which counts the first attempt too",
    ),
    ("attempts", "use `max_attempts`"),
    ("per_attempt_timeout", "use `attempt_timeout`"),
    ("delay", "use `initial_backoff`"),
    ("initial_delay", "use `initial_backoff`"),
    ("max_delay", "use `max_backoff`"),
    ("backoff_multiplier", "use `multiplier`"),
    ("fallback", "use `recover`"),
    (
        "when",
        "use `classify` (errors) or `retry_if` (successful values)",
    ),
    ("idempotency", "use `idempotent`"),
];

/// Collects errors so that every problem of an attribute is reported at once.
#[derive(Default)]
pub(crate) struct Errors(Option<Error>);

impl Errors {
    pub(crate) fn push(&mut self, e: Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }

    pub(crate) fn at(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.push(Error::new(span, msg));
    }

    pub(crate) fn push_all(&mut self, other: Errors) {
        if let Some(e) = other.0 {
            self.push(e);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub(crate) fn into_tokens(self) -> TokenStream {
        self.0.map(|e| e.to_compile_error()).unwrap_or_default()
    }
}

pub(crate) fn unknown_key(key: &Ident) -> Error {
    let name = key.to_string();
    let mut msg = format!("unknown key `{name}`");
    if let Some((_, new)) = RENAMED.iter().find(|(old, _)| *old == name) {
        let _ = write!(msg, "; {new}");
    } else if let Some(near) = nearest(&name) {
        let _ = write!(msg, "; did you mean `{near}`?");
    }
    msg.push_str("\nvalid keys: ");
    msg.push_str(
        &KEYS
            .iter()
            .map(|k| format!("`{k}`"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    Error::new(key.span(), msg)
}

/// The accepted key closest to `name` by edit distance, if close enough.
fn nearest(name: &str) -> Option<&'static str> {
    KEYS.iter()
        .map(|k| (distance(name, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_keys() {
        assert_eq!(nearest("max_attempt"), Some("max_attempts"));
        assert_eq!(nearest("deadlin"), Some("deadline"));
        assert_eq!(nearest("idempotnet"), Some("idempotent"));
        assert_eq!(nearest("zzzzzz"), None);
    }
}
