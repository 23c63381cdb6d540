//! The admin endpoint of `retries::control` over real sockets (issue 60):
//! mounted in axum beside a flaky route, it refuses a caller without
//! credentials (401) or with wrong ones (403) and a bad value (400, the
//! reason named), sets and lists an override, and a retry layer in the
//! same process obeys it from its next call; removed, the layer retries
//! again. The call name is this test's own: the overrides are the
//! process's, and the other tests' calls must not see it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retries::observe::Name;
use retries::{Backoff, Policy};
use retries_tower::admin::AdminService;
use retries_tower::{ReplayBody, RetryLayer};
use tower::ServiceExt;

static FLAKY: Name = Name::client("admin-test::flaky");

/// 503 for two requests in three, then 200.
async fn flaky(State(hits): State<Arc<AtomicU32>>) -> StatusCode {
    if hits.fetch_add(1, Ordering::SeqCst) % 3 < 2 {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one story, told in order
async fn the_admin_endpoint_refuses_sets_lists_and_the_layer_obeys_from_its_next_call() {
    let hits = Arc::new(AtomicU32::new(0));
    let app = Router::new()
        .route("/flaky", get(flaky))
        .with_state(Arc::clone(&hits))
        .nest_service("/admin", AdminService::bearer("operator", "s3cret-token"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let layer = RetryLayer::new(
        Policy::new(Duration::from_secs(10))
            .with_max_attempts(3)
            .with_backoff(Backoff::constant(Duration::from_millis(5))),
    )
    .budget(retries::NoBudget)
    .name(&FLAKY);
    let client: Client<_, ReplayBody<Empty<Bytes>>> =
        Client::builder(TokioExecutor::new()).build_http();
    let flaky_call = async || {
        let before = hits.load(Ordering::SeqCst);
        let request = http::Request::get(format!("{base}/flaky"))
            .body(Empty::new())
            .unwrap();
        let response = layer
            .clone()
            .layer(client.clone())
            .oneshot(request)
            .await
            .unwrap();
        (
            response.status().as_u16(),
            hits.load(Ordering::SeqCst) - before,
        )
    };
    assert_eq!(flaky_call().await, (200, 3), "retried twice");

    let admin = reqwest::Client::new();
    let url = format!("{base}/admin/overrides/admin-test%3A%3Aflaky");
    let put = |body: &'static str, token: Option<&'static str>| {
        let mut r = admin.put(&url).body(body);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    let good = r#"{"ttl": "1m", "retries": "off"}"#;
    assert_eq!(put(good, None).await.unwrap().status(), 401);
    assert_eq!(put(good, Some("guess")).await.unwrap().status(), 403);
    let bad = put(
        r#"{"ttl": "1m", "retries": "sometimes"}"#,
        Some("s3cret-token"),
    )
    .await
    .unwrap();
    assert_eq!(bad.status(), 400);
    let reason = bad.text().await.unwrap();
    assert!(
        reason.contains("sometimes") && reason.contains("admin-test::flaky"),
        "{reason}"
    );
    let over = put(r#"{"ttl": "1m", "share": 150}"#, Some("s3cret-token"))
        .await
        .unwrap();
    assert_eq!(over.status(), 400);
    assert_eq!(flaky_call().await, (200, 3), "nothing changed");

    assert_eq!(put(good, Some("s3cret-token")).await.unwrap().status(), 200);
    let listed = admin
        .get(format!("{base}/admin/overrides"))
        .bearer_auth("s3cret-token")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let ours = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["call"] == "admin-test::flaky")
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(ours["retries"], "off");
    assert_eq!(ours["source"], "endpoint (operator)");
    assert!(ours["left_ms"].as_u64().unwrap() <= 60_000, "{ours}");
    // The next call: its first attempt only.
    assert_eq!(flaky_call().await, (503, 1));

    let removed = admin
        .delete(&url)
        .bearer_auth("s3cret-token")
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 204);
    assert_eq!(
        flaky_call().await,
        (200, 2),
        "retried again (the 503 of two in three, then 200)"
    );
    let again = admin
        .delete(&url)
        .bearer_auth("s3cret-token")
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404);
}
