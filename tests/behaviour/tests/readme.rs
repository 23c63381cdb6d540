//! The README's code where services live: its first example and its
//! snippets, each compiled inside `tokio::spawn` and as an axum handler's
//! future (both need a `Send` future), and run there.
//!
//! The README cannot hide the lines a snippet needs around it, so its
//! snippets are `rust,ignore` there and compiled here, verbatim: the first
//! test fails when a block of the README is not found in this file, line by
//! line, in order. (The first example is also a doctest of the facade,
//! `retries::ReadmeExample`.) The transaction snippet is compiled the same
//! way by `tests/postgres/tests/readme.rs`, beside sqlx. The stand-ins
//! the README's code calls answer at once: `async` for the shape of a real
//! client (hence `unused_async` allowed).

#![allow(clippy::unused_async)]

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use tower::ServiceExt;

/// The README's blocks of Rust, and whether each is compiled here (the
/// transaction snippet is compiled in `tests/postgres`).
fn readme_blocks() -> Vec<String> {
    let readme = include_str!("../../../README.md");
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        match &mut current {
            None if line.starts_with("```rust") => current = Some(String::new()),
            Some(_) if line.starts_with("```") => blocks.push(current.take().unwrap()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// `needle`'s lines (trimmed, blank ones skipped) appear in `hay`'s lines,
/// in order and consecutively.
fn contains_lines(hay: &str, needle: &str) -> bool {
    let hay: Vec<&str> = hay
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let needle: Vec<&str> = needle
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle.as_slice())
}

#[test]
fn every_rust_block_of_the_readme_is_compiled_here_or_beside_sqlx() {
    let here = include_str!("readme.rs");
    let postgres = include_str!("../../postgres/tests/readme.rs");
    let blocks = readme_blocks();
    assert!(blocks.len() >= 5, "the README's blocks: {blocks:?}");
    for block in &blocks {
        // The first example's `main` prints; here it is spawned instead.
        let block = block
            .split("#[tokio::main]")
            .next()
            .expect("split yields at least one part");
        assert!(
            contains_lines(here, block) || contains_lines(postgres, block),
            "a README block that no test compiles (edit the README and the \
             test together):\n{block}"
        );
    }
}

/// The README is the front door: each door a line or two and its link,
/// the figures in the docs and `tests/bench/README.md` (issue 57, item 7).
#[test]
fn the_readme_stays_under_three_hundred_lines() {
    let lines = include_str!("../../../README.md").lines().count();
    assert!(lines < 300, "the README has {lines} lines");
}

#[test]
fn the_line_check_finds_blocks_in_order_only() {
    assert!(contains_lines("a\n  b\n\nc\n", "b\nc"));
    assert!(!contains_lines("a\nb\nc\n", "c\nb"));
    assert!(!contains_lines("a\nb\nc\n", "a\nc"));
    assert!(!contains_lines("a\n", ""));
}

/// The first example, verbatim.
#[rustfmt::skip]
mod first_example {
    use retries::{retryable, Classify, IdempotencyKey};

    #[derive(Debug, thiserror::Error, Classify)]
    enum PayError {
        #[error("service unavailable")] #[classify(unknown)]   Unavailable, // may have run
        #[error("invalid request")]     #[classify(permanent)] Invalid,
        #[error(transparent)]           Stopped(#[from] retries::Stopped),
    }

    struct Payments; // your HTTP or gRPC client

    impl Payments {
        async fn send(&self, cents: u64, key: IdempotencyKey) -> Result<String, PayError> {
            Ok(format!("receipt for {cents} cents, key {key}"))
        }
        async fn find(&self, _key: IdempotencyKey) -> Result<Option<String>, PayError> {
            Ok(None) // "no charge under this key": safe to send again
        }

        #[retryable(
            deadline = "2s",                      // the whole call: all attempts and pauses
            max_attempts = 3,                     // the first one included
            idempotent = false,                   // charging is not safe to repeat blindly
            reconcile = |key| self.find(key),     // after an unknown outcome: was it done?
            attempt = at,                         // binds &retries::Attempt in the body
        )]
        async fn charge(&self, cents: u64) -> Result<String, PayError> {
            self.send(cents, at.idempotency_key()).await // one key for every attempt
        }
    }

    async fn handler() -> String {
        format!("{:?}", Payments.charge(500).await)
    }

    #[tokio::test]
    async fn runs_spawned_and_as_an_axum_handler() {
        let _ = (PayError::Unavailable, PayError::Invalid);
        let spawned = tokio::spawn(async { Payments.charge(500).await })
            .await
            .unwrap()
            .unwrap();
        assert!(spawned.starts_with("receipt for 500 cents"), "{spawned}");
        let body = super::serve(super::Router::new().route("/", super::get(handler))).await;
        assert!(body.starts_with("Ok(\"receipt for 500 cents"), "{body}");
    }
}

/// The builder's snippet.
mod builder {
    use std::sync::Arc;
    use std::time::Duration;

    use axum::extract::State;
    use retries::{Attempt, Classify, Policy};

    const POLICY: Policy = Policy::new(Duration::from_secs(2)).validated();

    #[derive(Debug, thiserror::Error, Classify)]
    #[error("inventory unavailable")]
    #[classify(not_executed)]
    struct InventoryError(#[from] retries::Stopped);

    struct Inventory;

    impl Inventory {
        async fn stock(&self, sku: &str, left: Duration) -> Result<u32, InventoryError> {
            assert!(left <= Duration::from_secs(2));
            Ok(u32::try_from(sku.len()).unwrap())
        }
    }

    #[rustfmt::skip]
    async fn stock_of(inventory: &Inventory, sku: &str) -> Result<u32, InventoryError> {
        let stock = retries::call(&POLICY).idempotent()
            .run_fn(|at: &Attempt| inventory.stock(sku, at.remaining())).await?;
        Ok(stock)
    }

    async fn handler(State(inventory): State<Arc<Inventory>>) -> String {
        format!("{:?}", stock_of(&inventory, "sku-7").await)
    }

    #[tokio::test]
    async fn runs_spawned_and_as_an_axum_handler() {
        let inventory = Arc::new(Inventory);
        let shared = Arc::clone(&inventory);
        let sku = String::from("sku-42");
        let spawned = tokio::spawn(async move { stock_of(&shared, &sku).await })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(spawned, 6);
        let app = super::Router::new()
            .route("/", super::get(handler))
            .with_state(inventory);
        assert_eq!(super::serve(app).await, "Ok(5)");
    }
}

/// The tower layer's snippet, and the server layer's.
mod layers {
    use std::time::Duration;

    use axum::Router;
    use axum::routing::get;
    use bytes::Bytes;
    use http::header::HeaderName;
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use retries::Policy;
    use retries_tower::{RetryLayer, ServerLayer};
    use tower::{ServiceBuilder, ServiceExt};

    async fn orders() -> &'static str {
        "orders"
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[rustfmt::skip]
    async fn run_spawned() {
        let app = Router::new().route("/orders", get(orders)).layer(ServerLayer::http());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });

        let policy = Policy::new(Duration::from_secs(2)).with_max_attempts(3);
        let hyper_client = Client::builder(TokioExecutor::new()).build_http();
        let svc = ServiceBuilder::new()
            .layer(RetryLayer::new(policy).idempotent_with_header(HeaderName::from_static("idempotency-key")))
            .service(hyper_client);
        let answer = tokio::spawn(async move {
            let request = http::Request::get(format!("http://{address}/orders"))
                .body(Full::new(Bytes::new()))
                .unwrap();
            let response = svc.oneshot(request).await.unwrap();
            response.into_body().collect().await.unwrap().to_bytes()
        })
        .await
        .unwrap();
        assert_eq!(&answer[..], b"orders");
    }
}

/// The stream's snippet.
mod stream {
    use std::time::Duration;

    use futures_util::StreamExt;
    use retries::{Classify, Policy};

    const POLICY: Policy = Policy::new(Duration::from_secs(2)).validated();

    #[derive(Debug, thiserror::Error, Classify)]
    #[error("stream cut")]
    #[classify(not_executed)]
    struct FeedError(#[from] retries::Stopped);

    struct Event {
        seq: u64,
    }

    /// Events 1 to 3 after `after`, from a feed that keeps them.
    async fn subscribe(
        after: Option<u64>,
    ) -> Result<futures_util::stream::Iter<std::vec::IntoIter<Result<Event, FeedError>>>, FeedError>
    {
        let from = after.map_or(1, |seq| seq + 1);
        Ok(futures_util::stream::iter(
            (from..=3).map(|seq| Ok(Event { seq })).collect::<Vec<_>>(),
        ))
    }

    #[rustfmt::skip]
    async fn read_all() -> Vec<u64> {
        let events = retries::call(&POLICY).idempotent()
            .resume(|after: Option<u64>| subscribe(after), |e: &Event| e.seq);
        events.map(|e| e.unwrap().seq).collect().await
    }

    async fn handler() -> String {
        format!("{:?}", read_all().await)
    }

    #[tokio::test]
    async fn runs_spawned_and_as_an_axum_handler() {
        assert_eq!(tokio::spawn(read_all()).await.unwrap(), [1, 2, 3]);
        let app = super::Router::new().route("/", super::get(handler));
        assert_eq!(super::serve(app).await, "[1, 2, 3]");
    }
}

/// Answers one `GET /` through `app` (the handler's future must be `Send`
/// for the router to take it), as a string.
async fn serve(app: Router) -> String {
    use http_body_util::BodyExt;
    let request = http::Request::get("/")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), app.oneshot(request))
        .await
        .expect("the handler answers")
        .unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}
