//! HTTP against a real axum server with reqwest, through the core's own
//! HTTP helpers (`retries::http`), and the header parsers. The HTTP doors'
//! tests are beside their crates (`doors/retries-tower/tests`,
//! `doors/retries-chaos/tests`).

mod client;
mod http_headers;
