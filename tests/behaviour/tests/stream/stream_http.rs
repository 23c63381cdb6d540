//! Resumed HTTP streams against a real axum server on loopback: a chunked
//! body of numbered lines read from a cursor (`GET /events?after=N`), which
//! the server cuts at random points (the connection is aborted mid-body),
//! refuses with 503, or resumes a little early (repeating lines). Over 200
//! random scripts the consumer receives exactly `0..N`. And the HTTP half of
//! `ShedLayer`: 503 with `Retry-After`, obeyed by a retried call.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use retries::http::{HttpError, check};
use retries::stream::Error;
use retries::{Attempt, Backoff, Classify, NoBudget, Policy, Verdict};

// `call(&policy)`: `retries::call` under this file's own name.
crate::common::named_call!();

/// What one connection does.
#[derive(Debug, Clone, Copy)]
struct Conn {
    refuse: bool,
    replay: u64,
    lines: u64,
}

#[derive(Debug, Default)]
struct Log {
    len: u64,
    script: Mutex<VecDeque<Conn>>,
    opens: Mutex<Vec<Option<u64>>>,
}

impl Log {
    fn random(len: u64, seed: u64) -> Arc<Self> {
        let mut x = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut refusals = 0;
        let script = (0..len)
            .map(|_| {
                let refuse = refusals < 2 && next(8) == 0;
                refusals = if refuse { refusals + 1 } else { 0 };
                Conn {
                    refuse,
                    replay: next(3),
                    lines: 1 + next(10),
                }
            })
            .collect();
        Arc::new(Self {
            len,
            script: Mutex::new(script),
            opens: Mutex::default(),
        })
    }
}

#[derive(serde::Deserialize)]
struct After {
    after: Option<u64>,
}

async fn events(State(log): State<Arc<Log>>, Query(q): Query<After>) -> Response {
    log.opens.lock().unwrap().push(q.after);
    let conn = log.script.lock().unwrap().pop_front().unwrap_or(Conn {
        refuse: false,
        replay: 0,
        lines: u64::MAX,
    });
    if conn.refuse {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let next = q.after.map_or(0, |c| c + 1);
    let first = next.saturating_sub(conn.replay);
    let end = next.saturating_add(conn.lines).min(log.len);
    let cut = end < log.len;
    // Lines in chunks of up to three (a line may also be split across two
    // chunks), then an error: the server aborts the connection mid-body.
    let text = (first..end).fold(String::new(), |mut t, i| {
        use std::fmt::Write;
        let _ = writeln!(t, "{i}");
        t
    });
    let bytes = text.into_bytes();
    let chunks: Vec<Result<Bytes, std::io::Error>> = bytes
        .chunks(7)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    // The cut comes a moment after the lines, once they are on the wire (a
    // cut before the response head reaches the client is a failed attempt
    // that delivered nothing: realistic, but it would make attempts run out).
    let cut = futures_util::stream::iter(cut.then_some(())).then(|()| async {
        tokio::time::sleep(Duration::from_millis(2)).await;
        Err(std::io::Error::other("cut"))
    });
    axum::body::Body::from_stream(futures_util::stream::iter(chunks).chain(cut)).into_response()
}

async fn serve(log: Arc<Log>) -> String {
    let app = axum::Router::new()
        .route("/events", axum::routing::get(events))
        .with_state(log);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// The line reader's error: the transport or status (classified by the
/// crate's table), or a line that is not a number (permanent).
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("bad line")]
    Garbled,
}

impl Classify for ReadError {
    fn classify(&self) -> Verdict {
        match self {
            Self::Http(e) => e.classify(),
            Self::Garbled => Verdict::permanent(),
        }
    }
}

/// `GET {base}/events?after=…`, as a stream of numbers, one per line.
async fn open(
    client: reqwest::Client,
    base: String,
    after: Option<u64>,
) -> Result<impl futures_util::Stream<Item = Result<u64, ReadError>>, ReadError> {
    let url = match after {
        Some(c) => format!("{base}/events?after={c}"),
        None => format!("{base}/events"),
    };
    let response =
        check(client.get(url).send().await.map_err(HttpError::from)?).map_err(HttpError::from)?;
    // Lines complete so far wait in `ready` (a garbled one as an error,
    // after the good ones before it).
    Ok(futures_util::stream::unfold(
        (Some(response), Vec::<u8>::new(), VecDeque::new()),
        |(mut response, mut buf, mut ready)| async move {
            loop {
                if let Some(item) = ready.pop_front() {
                    return Some((item, (response, buf, ready)));
                }
                let r = response.as_mut()?;
                match r.chunk().await {
                    Ok(Some(chunk)) => {
                        buf.extend_from_slice(&chunk);
                        while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                            let line: Vec<u8> = buf.drain(..=i).collect();
                            let n = std::str::from_utf8(&line[..i])
                                .ok()
                                .and_then(|s| s.parse().ok());
                            ready.push_back(n.ok_or(ReadError::Garbled));
                        }
                    }
                    Ok(None) => response = None,
                    Err(e) => {
                        ready.push_back(Err(ReadError::Http(e.into())));
                        response = None;
                    }
                }
            }
        },
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_over_200_random_fault_scripts() {
    let mut tasks = tokio::task::JoinSet::new();
    let mut skipped = 0;
    for seed in 0..200u64 {
        let len = 10 + seed % 60;
        tasks.spawn(async move {
            let log = Log::random(len, seed);
            let base = serve(Arc::clone(&log)).await;
            let client = reqwest::Client::new();
            // At most two refusals in a row are scripted; 8 attempts leave
            // room for connections a busy machine cuts before their lines
            // were read (a reset can discard what the socket had buffered),
            // which deliver nothing. The property under test is the order
            // and the exactly-once delivery, not the count of attempts.
            let policy = Policy::new(Duration::from_secs(20))
                .with_max_attempts(8)
                .with_backoff(Backoff::constant(Duration::from_millis(1)));
            let s = call(&policy).idempotent().budget(NoBudget).resume(
                |after| open(client.clone(), base.clone(), after),
                |n: &u64| *n,
            );
            let mut s = std::pin::pin!(s);
            let mut got = Vec::new();
            while let Some(r) = s.next().await {
                match r {
                    Ok(n) => got.push(n),
                    Err(e) => panic!("seed {seed}: {e:?}"),
                }
            }
            assert_eq!(got, (0..len).collect::<Vec<_>>(), "seed {seed}");
            let opens = log.opens.lock().unwrap().clone();
            assert_eq!(s.counts().reopens as usize, opens.len() - 1, "seed {seed}");
            for w in opens.windows(2) {
                assert!(w[0] <= w[1], "seed {seed}: {opens:?}");
            }
            s.counts().skipped
        });
        if tasks.len() == 10 {
            while let Some(n) = tasks.join_next().await {
                skipped += n.unwrap();
            }
        }
    }
    while let Some(n) = tasks.join_next().await {
        skipped += n.unwrap();
    }
    assert!(skipped > 300, "skipped {skipped}");
}

#[tokio::test]
async fn a_garbled_line_ends_the_stream_as_permanent() {
    async fn garbled() -> &'static str {
        "0\n1\nnot a number\n2\n"
    }
    let app = axum::Router::new().route("/events", axum::routing::get(garbled));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = reqwest::Client::new();
    let policy = Policy::new(Duration::from_secs(2));
    let s = call(&policy).idempotent().resume(
        |after| open(client.clone(), base.clone(), after),
        |n: &u64| *n,
    );
    let items: Vec<_> = s.collect().await;
    assert_eq!(items.len(), 3);
    assert_eq!(*items[1].as_ref().unwrap(), 1);
    let Err(Error::Stopped(f)) = &items[2] else {
        panic!("{:?}", items[2])
    };
    assert_eq!(f.reason(), retries::Reason::Permanent);
    assert!(matches!(f.last_error(), Some(ReadError::Garbled)));
}

#[tokio::test]
async fn a_shedding_server_answers_503_with_retry_after_and_the_client_waits() {
    // One slot; a 300 ms request holds it. The next request is answered 503
    // with `Retry-After: 1` (the 200 ms pushback rounded up to a second), and
    // a retried call waits that second, then succeeds.
    async fn slow() -> &'static str {
        tokio::time::sleep(Duration::from_millis(300)).await;
        "done"
    }
    let app = axum::Router::new()
        .route("/slow", axum::routing::get(slow))
        .layer(retries_tower::ShedLayer::new(1, Duration::from_millis(200)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/slow", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = reqwest::Client::new();
    let holder = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { client.get(url).send().await.unwrap().status() }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let refused = client.get(&url).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");

    let policy = Policy::new(Duration::from_secs(3));
    let t0 = Instant::now();
    let body = call(&policy)
        .idempotent()
        .run(async |_: &Attempt| -> Result<String, HttpError> {
            let r = check(client.get(&url).send().await?)?;
            Ok(r.text().await?)
        })
        .await
        .unwrap();
    let elapsed = t0.elapsed();
    assert_eq!(holder.await.unwrap(), StatusCode::OK);
    assert_eq!(body, "done");
    // Refused at once, paused 1 s, then served in 300 ms.
    assert!(
        elapsed >= Duration::from_millis(1300) && elapsed < Duration::from_secs(3),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn a_body_cut_mid_way_is_an_unknown_outcome() {
    // `reqwest` reports it as a decode error caused by an I/O error; the
    // cause decides (it was `Permanent` before this test found it).
    async fn cut() -> Response {
        let cut = futures_util::stream::once(async {
            tokio::time::sleep(Duration::from_millis(2)).await;
            Err::<Bytes, _>(std::io::Error::other("cut"))
        });
        let body = futures_util::stream::iter([Ok(Bytes::from_static(b"partial"))]).chain(cut);
        axum::body::Body::from_stream(body).into_response()
    }
    let app = axum::Router::new().route("/cut", axum::routing::get(cut));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/cut", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let e = reqwest::get(url).await.unwrap().text().await.unwrap_err();
    assert!(e.is_decode() || e.is_body(), "{e:?}");
    assert_eq!(e.classify(), Verdict::unknown());
}
