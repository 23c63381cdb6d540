//! The `retries` engine as tower layers: [`RetryLayer`] over any
//! `Service<http::Request<B>>`, such as a hyper-util client or (with the
//! `tonic` feature and [`RetryLayer::grpc`]) a `tonic::transport::Channel`;
//! for servers (axum, hyper, tonic), [`ServerLayer`] (the caller's deadline
//! as the handler's scope, "don't retry me" on the way back: see
//! [`retries::wire`](retries_core::wire)) and [`ShedLayer`] (a concurrency
//! limit that refuses honestly) and [`dedup::IdempotencyLayer`] (each
//! idempotency key run once, its answer replayed); [`balance`] for the next
//! attempt on another replica; with `service-config`, gRPC service configs
//! (gRFC A6) in [`service_config`].
//!
//! This crate is built on the core's public seam
//! ([`retries_core::door`]) alone, and versioned with tower,
//! `http-body` and tonic: their releases are releases of this crate, never
//! of `retries`. The request extensions a caller sets
//! ([`Idempotency`], [`Deadline`], [`Route`]) and the body the inner
//! client must take ([`ReplayBody`]) are `retries-http`'s, shared with
//! `retries-reqwest` and re-exported here.
//!
//! Each request is one logical call of the same engine `#[retryable]` drives,
//! under the layer's [`Policy`]: one deadline for every attempt and pause,
//! the attempt timeout and reserve, the backoff, the decision table, the
//! layer's budget and optional breaker, and the server's pushback.
//!
//! ```
//! use std::time::Duration;
//! use http::header::HeaderName;
//! use retries::Policy;
//! use retries_tower::RetryLayer;
//!
//! let policy = Policy::new(Duration::from_secs(2)).with_max_attempts(3);
//! // For a hyper client: a POST is retried only with an idempotency key.
//! let http = RetryLayer::new(policy)
//!     .idempotent_with_header(HeaderName::from_static("idempotency-key"));
//! // `http.layer(client)` (no trait to import), or `ServiceBuilder::new().layer(http)`.
//! # let _ = http;
//! ```
//!
//! The client under the layer takes [`ReplayBody<B>`](retries_http::ReplayBody)
//! (the body the layer replays on each attempt), so a hyper client's body
//! type names it; kept in a struct, the layered client is a
//! [`RetryService`] of that client:
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::client::legacy::{Client, connect::HttpConnector};
//! use hyper_util::rt::TokioExecutor;
//! use retries::Policy;
//! use retries_tower::ReplayBody;
//! use retries_tower::{RetryLayer, RetryService};
//!
//! /// The inner client takes `ReplayBody<Full<Bytes>>`; callers send
//! /// `http::Request<Full<Bytes>>` through the layer.
//! type HttpClient = RetryService<Client<HttpConnector, ReplayBody<Full<Bytes>>>>;
//!
//! struct Api {
//!     http: HttpClient,
//! }
//!
//! /// Where services live: a request through the layer in a spawned task
//! /// (as an axum handler's future is, both need `Send`).
//! fn spawn_get(api: &Api) -> tokio::task::JoinHandle<()> {
//!     use tower_service::Service;
//!     let mut http = api.http.clone();
//!     tokio::spawn(async move {
//!         if std::future::poll_fn(|cx| http.poll_ready(cx)).await.is_ok() {
//!             let request = http::Request::get("http://127.0.0.1:8080/orders")
//!                 .body(Full::new(Bytes::new()))
//!                 .expect("a valid request");
//!             let _response = http.call(request).await;
//!         }
//!     })
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let client = Client::builder(TokioExecutor::new()).build_http();
//! let api = Api { http: RetryLayer::new(Policy::new(Duration::from_secs(2))).layer(client) };
//! # let _ = spawn_get;
//! # let _ = api.http;
//! # }
//! ```
//!
//! For a tonic channel, `RetryLayer::grpc(policy)` (feature `tonic`), with
//! the methods that are safe to repeat named:
//! `.idempotent_methods(["/payments.Payments/GetCharge"])`, then
//! `PaymentsClient::new(layer.layer(channel))`.
//!
//! # Idempotency, per request, never assumed
//!
//! A request is safe to repeat when, in this order:
//!
//! 1. it carries an [`Idempotency`] extension: that says it;
//! 2. it carries the header named by [`RetryLayer::idempotent_with_header`]
//!    (an idempotency key the server deduplicates by): yes;
//! 3. the predicate of [`RetryLayer::idempotent_when`] holds: yes;
//! 4. otherwise, for HTTP, the methods RFC 9110 defines as idempotent
//!    (`GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`) are, the others
//!    (`POST`, `PATCH`, …) are not; for gRPC, only the methods named by
//!    [`RetryLayer::idempotent_methods`] are.
//!
//! A request that is not idempotent is never repeated after an unknown
//! outcome: [`RetryLayer::reconcile`] may look it up by key (with
//! [`RetryLayer::send_key`], every attempt carries the call's key), else the
//! layer returns what the attempt returned.
//!
//! # Responses are classified
//!
//! A response is an `Ok` of the inner service, whatever its status; the layer
//! classifies it. HTTP: a status of 400 or more by the
//! [status table](retries_core::http) with its `Retry-After`. gRPC: a trailers-only
//! response by its `grpc-status` ([status table](retries_core::tonic)) and
//! `grpc-retry-pushback-ms`; any other response commits the call (its
//! headers have arrived: gRFC A6). An error of the inner service is
//! classified by its source chain ([`classify_chain`](retries_core::classify_chain)); a refused connection
//! is `NotExecuted`, and an error nothing recognises is `Unknown` (it may have
//! come after the request was sent).
//!
//! When the call stops, the caller gets the last response if there was one
//! (a 503 after the last attempt is returned as the 503 it is), else the last
//! error; a call stopped by its deadline or an open breaker fails with
//! [`Stopped`](retries_core::Stopped) (in gRPC mode a `tonic::Status`, `DEADLINE_EXCEEDED` or
//! `UNAVAILABLE`, which tonic's client passes on as it is).
//!
//! # Bodies of any size
//!
//! The request body is copied as it is sent, up to [`RetryLayer::body_cap`]
//! bytes (64 KiB by default, [`DEFAULT_CAP`]; per request a [`BodyCap`]
//! extension); a retry sends the same bytes, a streaming body included. A
//! body that has already ended when the request comes in (a GET's, most
//! often) needs no copy: none is made. A body larger than the cap commits
//! the call once the cap is passed: no other attempt is made, a DEBUG event
//! says so when it happens, and an error that would have been retried
//! comes back as [`NotReplayed`] ([`Lost::OverCap`], with the cap and the
//! bytes sent; a response, with [`Ended::lost`]).
//!
//! A [`Reopen`] extension instead opens the body again for each attempt,
//! with nothing held between them: [`Reopen::file`] (read from its start,
//! with its `Content-Length`; a file that changed is not sent again:
//! [`Lost::Changed`]), [`Reopen::bytes`], [`Reopen::with`] (a factory of
//! yours). The request's own body is then dropped:
//!
//! ```no_run
//! # fn upload() -> http::Request<http_body_util::Empty<bytes::Bytes>> {
//! let mut request = http::Request::put("http://127.0.0.1:8080/backups/2026-12-05.tar")
//!     .body(http_body_util::Empty::new())
//!     .expect("a valid request");
//! request
//!     .extensions_mut()
//!     .insert(retries_tower::Reopen::file("/var/backups/2026-12-05.tar"));
//! # request
//! # }
//! ```
//!
//! # Deadlines on the wire
//!
//! A request may bring its own deadline: a `grpc-timeout` header (gRPC mode)
//! or a [`Deadline`] extension. The call's deadline is the earlier of it and
//! the policy's: never extended. In gRPC mode each attempt carries
//! `grpc-timeout` (the attempt's own time left) and, on retries,
//! `grpc-previous-rpc-attempts`.
//!
//! # One owner of retries
//!
//! A request made inside an attempt of a `#[retryable]` function (or any
//! retried call, in the same task) is not retried by the layer: it makes one
//! attempt, bounded by that attempt's deadline, and the outer loop decides,
//! as for nested `#[retryable]` calls. A request the layer could not resolve
//! (a non-idempotent unknown outcome) marks the outer attempt, so the outer
//! loop does not replay it blindly either. The layer must be polled in the
//! caller's task for this (it is, unless a `tower::buffer::Buffer` sits
//! above it).
//!
//! # Costs
//!
//! Per request: the body buffer (one shared allocation, plus the chunks kept)
//! and the response future, which is boxed (the loop is an `async` block,
//! which a `Service::Future` cannot name on stable Rust). In gRPC mode, each
//! attempt's body is also boxed by `tonic::body::Body::new`.
//!
//! # Where things are
//!
//! This file holds the layer and its setters; `protocol.rs` the protocols
//! ([`Http`], [`Grpc`]) and how a response is judged; `service.rs` the
//! per-request service ([`RetryService`]), one engine call per request;
//! `shed.rs` [`ShedLayer`], the server side of backpressure; [`balance`]
//! the endpoints a call tried and a balancer that avoids them; [`dedup`]
//! the server half of exactly-once ([`dedup::IdempotencyLayer`]).

use std::future::Future;
use std::sync::Arc;

use http::request::Parts;

use retries_core::attempt::IdempotencyKey;
use retries_core::breaker::NoBreaker;
use retries_core::budget::TokenBucket;
use retries_core::observe::Name;
use retries_core::policy::Policy;
use retries_http::door::{ResponseVerdict, Settings};

#[cfg(feature = "admin")]
pub mod admin;
pub mod balance;
pub mod dedup;
mod layer;
mod protocol;
mod server;
mod service;
#[cfg(feature = "service-config")]
pub mod service_config;
mod shed;

pub use layer::{NoLookup, Reconcile, ReconcileFn, RetryLayer};
#[cfg(feature = "tonic")]
pub use protocol::Grpc;
pub use protocol::Http;
pub use protocol::Protocol;
pub use server::{ServerFuture, ServerLayer, ServerService};
pub use service::RetryService;
pub use shed::{ShedFuture, ShedLayer, ShedService};

// What the layer's users name, from the HTTP doors' shared crate: the
// request extensions, the body the client under the layer takes, the
// errors of a request that could not be sent again.
pub use retries_http::{
    BodyCap, BoxError, DEFAULT_CAP, Deadline, Ended, FailedAttempt, Idempotency, Lost, NotReplayed,
    Opened, Reopen, ReplayBody, Route,
};

/// The name the layer's calls report under unless [`RetryLayer::name`] says
/// otherwise.
pub static NAME: Name = Name::client("retries::tower");

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Http {}
    #[cfg(feature = "tonic")]
    impl Sealed for super::Grpc {}
    impl Sealed for super::NoLookup {}
    impl<F> Sealed for super::ReconcileFn<F> {}
}
