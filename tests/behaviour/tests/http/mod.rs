//! HTTP against a real axum server with reqwest, and the header parsers;
//! uploads of any size through both HTTP doors.

mod across;
mod chaos;
mod client;
mod http_headers;
mod uploads;
