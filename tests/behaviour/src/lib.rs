//! Tests only. The behaviour tests of `retries` live in `tests/` (one file
//! per concern, with every feature of the facade on), and the HTTP demo in
//! `examples/http.rs`; they are a package of their own so that their heavy
//! dependencies (a real HTTP server and client, property testing, metrics
//! recorders) stay out of the facade's dev-dependencies.
