//! Misuse is a compile error that names the fix: one concern per file in
//! `tests/ui/`, with the expected diagnostics committed as `.stderr`
//! (regenerate with `TRYBUILD=overwrite` and review the diff). Files in
//! `tests/ui-pass/` must compile cleanly under strict lints.
//!
//! rustc's notes list the implementations of a trait, which depend on the
//! features of `retries`; this package fixes them (see its `Cargo.toml`), so
//! the expected output is the same under every feature set of the workspace.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
    t.pass("tests/ui-pass/*.rs");
}
