//! Request bodies of any size, retried, over real sockets (issue 61): a
//! file opened again for each attempt through each HTTP door while the
//! server cuts the connection at random points, a multipart form rebuilt
//! after a 503, a stream past the replay cap that gets one attempt and
//! says why, a larger cap per request, a file changed between attempts,
//! a factory that fails. The server checks every byte it receives
//! (`tests/support/uploads.rs`). The memory of a large upload is measured in a
//! process of its own: `upload_memory.rs`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{Empty, StreamBody};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retries::{Backoff, Policy, Reason};
use retries_http::{BodyCap, Ended, Lost, NotReplayed, Opened, Reopen, ReplayBody};
use tower::ServiceExt;

use crate::support::{Uploads, pattern, pattern_bytes, write_file};

fn policy() -> Policy {
    Policy::new(Duration::from_secs(30))
        .with_max_attempts(4)
        .with_backoff(Backoff::constant(Duration::from_millis(5)))
}

fn seed() -> u64 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    u64::from(seed)
}

fn temp_file(name: &str, len: u64) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("retries-upload-{}-{name}", std::process::id()));
    write_file(&path, len);
    path
}

fn reqwest_client() -> reqwest_middleware::ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(retries_reqwest::RetryMiddleware::new(policy()))
        .build()
}

/// A body streamed in chunks of 16 KiB: the pattern's first `len` bytes.
type Chunks = StreamBody<
    futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::io::Error>>>,
>;

fn chunks(len: u64) -> Chunks {
    let all = pattern_bytes(len);
    let frames: Vec<_> = all
        .chunks(16 * 1024)
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    StreamBody::new(futures_util::stream::iter(frames))
}

/// A request through the tower layer over a hyper client.
async fn through_tower<B>(
    layer: retries_tower::RetryLayer,
    request: http::Request<B>,
) -> Result<http::Response<hyper::body::Incoming>, retries_tower::BoxError>
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + Sync + 'static,
    B::Error: Into<retries_tower::BoxError>,
{
    let client: Client<_, ReplayBody<B>> = Client::builder(TokioExecutor::new()).build_http();
    layer.layer(client).oneshot(request).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_cut_twice_is_uploaded_whole_through_each_door() {
    let seed = seed();
    let server = Uploads::start(seed).await;
    let len = 8 << 20;
    let path = temp_file("cut-twice", len);

    let response = reqwest_client()
        .put(server.url(&format!("/file/reqwest?len={len}&cuts=2")))
        .with_extension(Reopen::file(&path))
        .send()
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
    assert_eq!(response.status(), 200, "seed {seed}");

    let mut request = http::Request::put(server.url(&format!("/file/tower?len={len}&cuts=2")))
        .body(Empty::<Bytes>::new())
        .unwrap();
    request.extensions_mut().insert(Reopen::file(&path));
    let response = through_tower(retries_tower::RetryLayer::new(policy()), request)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
    assert_eq!(response.status(), 200, "seed {seed}");

    for door in ["reqwest", "tower"] {
        let saw = server.record(door);
        assert_eq!(saw.bad, None, "{door}, seed {seed}");
        assert_eq!(saw.attempts, 3, "{door}, seed {seed}: two cuts, then whole");
        assert_eq!(saw.cut_at.len(), 2, "{door}, seed {seed}");
        assert_eq!(
            saw.completed,
            Some(len),
            "{door}, seed {seed}: every byte, checked"
        );
    }
    std::fs::remove_file(path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_form_with_a_file_part_is_rebuilt_after_a_503() {
    let server = Uploads::start(1).await;
    let len = 256 * 1024;
    let path = Arc::new(temp_file("multipart", len));
    let form_path = Arc::clone(&path);
    let response = reqwest_client()
        .put(server.url(&format!("/multipart/form?len={len}")))
        .with_extension(retries_reqwest::multipart(move || {
            let path = Arc::clone(&form_path);
            async move {
                reqwest::multipart::Form::new()
                    .text("title", "December")
                    .file("report", &*path)
                    .await
            }
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let seen = server.record("form");
    assert_eq!(seen.bad, None);
    assert_eq!(seen.attempts, 2, "a 503, then the form again");
    assert_eq!(seen.completed, Some(len));
    assert_eq!(seen.boundaries.len(), 2);
    assert_ne!(
        seen.boundaries[0], seen.boundaries[1],
        "each attempt's form is new, and its Content-Type carries its boundary"
    );
    std::fs::remove_file(&*path).unwrap();
}

/// Why the body could not be sent again, from the middleware's error.
fn lost(error: &reqwest_middleware::Error) -> Lost {
    match error {
        reqwest_middleware::Error::Middleware(e) => match e.downcast_ref::<NotReplayed>() {
            Some(n) => n.lost(),
            None => panic!("no NotReplayed in {error:?}"),
        },
        reqwest_middleware::Error::Reqwest(_) => panic!("no NotReplayed in {error:?}"),
    }
}

/// Why the body could not be sent again, from the layer's error.
fn over_cap(error: &(dyn std::error::Error + 'static)) -> Lost {
    let mut e = Some(error);
    while let Some(err) = e {
        if let Some(n) = err.downcast_ref::<NotReplayed>() {
            return n.lost();
        }
        e = err.source();
    }
    panic!("no NotReplayed in {error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_past_the_cap_gets_one_attempt_and_says_why() {
    let server = Uploads::start(2).await;
    let len = 200 * 1024;
    let expected = Lost::OverCap {
        cap: retries_http::DEFAULT_CAP,
        sent: len,
    };

    // The connection is cut after the whole body was read: not retried.
    let e = reqwest_client()
        .put(server.url(&format!("/stream/reqwest-cut?len={len}&cuts=1")))
        .body(reqwest::Body::wrap(chunks(len)))
        .send()
        .await
        .unwrap_err();
    assert_eq!(lost(&e), expected, "{e}");
    assert!(
        e.to_string()
            .contains("replay cap of 65536 bytes (204800 bytes sent)"),
        "{e}"
    );
    let request = http::Request::put(server.url(&format!("/stream/tower-cut?len={len}&cuts=1")))
        .body(chunks(len))
        .unwrap();
    let e = through_tower(retries_tower::RetryLayer::new(policy()), request)
        .await
        .unwrap_err();
    assert_eq!(over_cap(&*e), expected, "{e}");

    // A 503: the response is the answer, and says why it was not retried.
    let response = reqwest_client()
        .put(server.url(&format!("/stream/reqwest-503?len={len}&status=503")))
        .body(reqwest::Body::wrap(chunks(len)))
        .send()
        .await
        .unwrap();
    let ended = *response.extensions().get::<Ended>().unwrap();
    assert_eq!(
        (ended.reason(), ended.attempts(), ended.lost()),
        (Reason::Permanent, 1, Some(expected))
    );
    let request =
        http::Request::put(server.url(&format!("/stream/tower-503?len={len}&status=503")))
            .body(chunks(len))
            .unwrap();
    let response = through_tower(retries_tower::RetryLayer::new(policy()), request)
        .await
        .unwrap();
    let ended = *response.extensions().get::<Ended>().unwrap();
    assert_eq!(
        (ended.reason(), ended.attempts(), ended.lost()),
        (Reason::Permanent, 1, Some(expected))
    );

    for name in ["reqwest-cut", "tower-cut", "reqwest-503", "tower-503"] {
        let seen = server.record(name);
        assert_eq!((seen.attempts, seen.bad), (1, None), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_larger_cap_for_one_request_lets_its_stream_be_sent_again() {
    let server = Uploads::start(3).await;
    let len = 200 * 1024;
    let response = reqwest_client()
        .put(server.url(&format!("/stream/reqwest?len={len}&cuts=1")))
        .body(reqwest::Body::wrap(chunks(len)))
        .with_extension(BodyCap(1 << 20))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut request = http::Request::put(server.url(&format!("/stream/tower?len={len}&cuts=1")))
        .body(chunks(len))
        .unwrap();
    request.extensions_mut().insert(BodyCap(1 << 20));
    let response = through_tower(retries_tower::RetryLayer::new(policy()), request)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    for name in ["reqwest", "tower"] {
        let seen = server.record(name);
        assert_eq!(
            (seen.attempts, seen.completed, seen.bad),
            (2, Some(len), None),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_changed_between_attempts_is_not_sent_again() {
    let server = Uploads::start(4).await;
    let len = 1 << 20;
    let path = Arc::new(temp_file("changed", len));
    let changed = Arc::clone(&path);
    // Between the attempts, the file is written again: one byte more.
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(
            retries_reqwest::RetryMiddleware::new(policy())
                .on_retry(move |_| write_file(&changed, len + 1)),
        )
        .build();
    let e = client
        .put(server.url(&format!("/file/changed?len={len}&cuts=1")))
        .with_extension(Reopen::file(&*path))
        .send()
        .await
        .unwrap_err();
    assert_eq!(lost(&e), Lost::Changed, "{e}");
    let seen = server.record("changed");
    assert_eq!(
        (seen.attempts, seen.completed),
        (1, None),
        "nothing sent after the change"
    );
    std::fs::remove_file(&*path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_factory_that_fails_sends_nothing_and_ends_the_call() {
    let server = Uploads::start(5).await;
    let e = reqwest_client()
        .put(server.url("/file/factory?len=4"))
        .with_extension(Reopen::with(|| async {
            Err::<Opened, _>(std::io::Error::other("the object store is down"))
        }))
        .send()
        .await
        .unwrap_err();
    assert_eq!(lost(&e), Lost::Unopened, "{e}");
    let mut request = http::Request::put(server.url("/file/factory-tower?len=4"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    // A factory that works: each attempt gets the same four bytes.
    request.extensions_mut().insert(Reopen::with(|| async {
        let bytes: Vec<u8> = (0..4).map(pattern).collect();
        Ok::<_, std::io::Error>(
            Opened::body(http_body_util::Full::new(Bytes::from(bytes))).length(4),
        )
    }));
    let response = through_tower(retries_tower::RetryLayer::new(policy()), request)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(server.record("factory").attempts, 0, "nothing was sent");
    assert_eq!(server.record("factory-tower").completed, Some(4));
}
