//! Tests only. The behaviour tests of `retries` live in `tests/`: one binary
//! with a module per door (`tests/main.rs`), every feature of the facade on,
//! indexed by the workspace's `tests/README.md`; the HTTP demo is in
//! `examples/http.rs`; they are a package of their own so that their heavy
//! dependencies (a real HTTP server and client, property testing, metrics
//! recorders) stay out of the facade's dev-dependencies.
