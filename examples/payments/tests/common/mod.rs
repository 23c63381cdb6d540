//! What more than one test file of this package uses.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// An axum server on loopback whose `GET /users/{id}` answers 503 the first
/// time and 200 after; returns its address and the requests it received.
pub(crate) async fn flaky_users() -> (SocketAddr, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let app = {
        let calls = Arc::clone(&calls);
        axum::Router::new().route(
            "/users/{id}",
            axum::routing::get(move || {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        axum::http::StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        axum::http::StatusCode::OK
                    }
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, calls)
}
