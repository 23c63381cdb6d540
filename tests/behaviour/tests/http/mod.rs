//! HTTP against a real axum server with reqwest, and the header parsers.

mod across;
mod chaos;
mod client;
mod http_headers;
