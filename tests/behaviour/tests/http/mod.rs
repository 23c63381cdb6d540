//! HTTP against a real axum server with reqwest, and the header parsers.

mod client;
mod http_headers;
