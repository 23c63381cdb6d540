//! Resumed streams: on the paused clock, and over HTTP against axum.

mod outbox;
mod resume;
mod stream_http;
