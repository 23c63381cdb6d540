//! Property test of the attribute parser and the derive: thousands of random
//! or mangled token streams never panic, and anything malformed comes back as
//! a compile error (with the item still emitted).

use proc_macro2::TokenStream;
use proptest::prelude::*;

/// Tokens besides the keys themselves (`args::KEYS`).
const OTHER: &[&str] = &[
    "=",
    "=",
    ",",
    ",",
    "\"2s\"",
    "\"250ms\"",
    "\"2x\"",
    "\"\"",
    "\"1.5s\"",
    "0",
    "3",
    "-1",
    "2.0",
    "0.5",
    "1.5",
    "true",
    "false",
    "at",
    "|k| f(k)",
    "\"none\"",
    "\"full\"",
    "\"exponential\"",
    "\"constant\"",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "::",
    "#",
    "!",
    ";",
    "self",
    "fn",
    "async",
    "'a",
    "\"::x\"",
    "u32",
    "<",
    ">",
];

fn word(i: usize) -> &'static str {
    let keys = crate::ast::KEYS;
    let i = i % (keys.len() + OTHER.len());
    keys.get(i)
        .copied()
        .unwrap_or_else(|| OTHER[i - keys.len()])
}

const ITEMS: &[&str] = &[
    "async fn f() -> Result<u32, E> { Ok(1) }",
    "async fn f(&self, x: &str) -> Result<(), E> { Ok(()) }",
    "fn f() -> Result<u32, E> { Ok(1) }",
    "async fn f() {}",
    "async fn f() -> u32 { 1 }",
    "const fn f() -> Result<u32, E> { Ok(1) }",
    "struct S;",
    "async fn f(&self) -> Result<u32, E>;",
    "enum E { A }",
];

fn tokens(words: &[usize]) -> Option<TokenStream> {
    let text: Vec<&str> = words.iter().map(|i| word(*i)).collect();
    text.join(" ").parse().ok()
}

fn is_error(out: &TokenStream) -> bool {
    out.to_string().contains("compile_error")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn attribute_never_panics(words in prop::collection::vec(any::<usize>(), 0..14), item in 0..ITEMS.len()) {
        let Some(attr) = tokens(&words) else { return Ok(()) };
        let item_tokens: TokenStream = ITEMS[item].parse().unwrap();
        let out = crate::expand_tokens(attr.clone(), item_tokens);
        // Either a compile error, or a well-formed function.
        if !is_error(&out) {
            prop_assert!(syn::parse2::<syn::ItemFn>(out.clone()).is_ok(), "{attr} => {out}");
            prop_assert!(item <= 1, "a bad item was accepted: {}", ITEMS[item]);
        }
        // The item is always emitted, so no error follows from its absence.
        let text = out.to_string();
        prop_assert!(
            ["fn f", "struct S", "enum E"].iter().any(|name| text.contains(name)),
            "the item was dropped: {text}"
        );
    }

    #[test]
    fn keys_with_random_values_never_panic(key in 0..20usize, value in prop::collection::vec(any::<usize>(), 1..5)) {
        let Some(value) = tokens(&value) else { return Ok(()) };
        let attr: TokenStream = format!("deadline = \"1s\", idempotent = false, {} = {value}", word(key)).parse().unwrap();
        let item: TokenStream = ITEMS[0].parse().unwrap();
        let _ = crate::expand_tokens(attr, item);
    }

    #[test]
    fn derive_never_panics(words in prop::collection::vec(any::<usize>(), 0..10)) {
        let Some(inner) = tokens(&words) else { return Ok(()) };
        let input: TokenStream = format!("enum E {{ #[classify({inner})] A, B(#[from] x::Y), #[classify(unknown)] C {{ #[classify(retry_after)] d: D }} }}").parse().unwrap();
        let out = crate::classify::derive(input);
        prop_assert!(is_error(&out), "variant B has `#[from]` but A is broken or unclassified: {out}");
    }
}

#[test]
fn a_valid_attribute_expands_without_errors() {
    let attr: TokenStream = "deadline = \"2s\", idempotent, max_attempts = 3"
        .parse()
        .unwrap();
    let out = crate::expand_tokens(attr, ITEMS[0].parse().unwrap());
    assert!(!is_error(&out), "{out}");
    assert!(out.to_string().contains("drive"));
}
