//! Tests only. The compile-fail suite lives in `tests/ui/` (one misuse per
//! file, with the expected diagnostics), and the cases that must compile
//! cleanly and run are test targets in `pass/`; it is a package
//! of its own so that `trybuild`, which builds every dev-dependency again,
//! builds only the few this suite needs, and so that the features of
//! `retries`, which change rustc's notes, are fixed.
