//! Misuse is a compile error that names the fix: one concern per file in
//! `tests/ui/`, with the expected diagnostics committed as `.stderr`
//! (regenerate with `TRYBUILD=overwrite` and review the diff). The files
//! that must compile cleanly under strict lints are test targets of their
//! own, in `pass/` (see `Cargo.toml`): trybuild builds and runs nothing here,
//! it only checks.
//!
//! rustc's notes list the implementations of a trait, which depend on the
//! features of `retries`; this package fixes them (see its `Cargo.toml`), so
//! the expected output is the same under every feature set of the workspace.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
