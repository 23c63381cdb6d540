//! Misuse is a compile error that names the fix: one concern per file in
//! `tests/ui/`, with the expected diagnostics committed as `.stderr`
//! (regenerate with `TRYBUILD=overwrite` and review the diff). Files in
//! `tests/ui-pass/` must compile cleanly under strict lints.
//!
//! rustc's notes list the implementations of a trait, which depend on the
//! crate's features, so the `.stderr` files are those of `--all-features`
//! (the README's test command); with other features this test is ignored.

#[test]
#[cfg_attr(
    not(all(feature = "tracing", feature = "metrics", feature = "testing")),
    ignore = "the .stderr files are those of `cargo test --all-features`"
)]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
    t.pass("tests/ui-pass/*.rs");
}
