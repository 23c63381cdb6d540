//! An upload server on loopback (hyper, HTTP/1.1) that checks every byte
//! it receives against a known pattern, and cuts connections on cue: the
//! server of the upload tests, in the door's behaviour binary and in the memory
//! test's own process (`upload_memory.rs`).
//!
//! Routes, `{name}` naming one upload (attempts are counted per name):
//!
//! * `/file/{name}?len=N&cuts=K`: the body must be the pattern's first `N`
//!   bytes; each of the first `K` attempts is cut (the connection dropped,
//!   no answer) at a random byte of the body; then 200.
//! * `/multipart/{name}?len=N`: a multipart form whose part `report` is the
//!   pattern's first `N` bytes; the first attempt is answered 503 after
//!   its body was read, the next checked and answered 200.
//! * `/stream/{name}?len=N&cuts=K&status=S`: the whole body read and
//!   checked, then the first `K` attempts cut; then status `S` (200 if none).

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

/// The byte at `offset` of every upload.
#[must_use]
pub fn pattern(offset: u64) -> u8 {
    ((offset ^ (offset >> 13)) % 251) as u8
}

/// The first `len` bytes of the pattern.
#[must_use]
pub fn pattern_bytes(len: u64) -> Vec<u8> {
    (0..len).map(pattern).collect()
}

/// A file of the pattern's first `len` bytes, written in 1 MiB blocks.
pub fn write_file(path: &std::path::Path, len: u64) {
    use std::io::Write;
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).expect("a temporary file"));
    let mut offset = 0;
    while offset < len {
        let end = (offset + (1 << 20)).min(len);
        let block: Vec<u8> = (offset..end).map(pattern).collect();
        file.write_all(&block).expect("written");
        offset = end;
    }
    file.flush().expect("flushed");
}

/// What the server saw of one upload.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// Requests received.
    pub attempts: u32,
    /// Bytes received and checked by the attempt that was answered 200.
    pub completed: Option<u64>,
    /// Where each cut attempt was cut (bytes received).
    pub cut_at: Vec<u64>,
    /// The multipart boundaries of the attempts, in order.
    pub boundaries: Vec<String>,
    /// A byte that did not match, or a length that did not.
    pub bad: Option<String>,
}

/// The server.
#[derive(Clone)]
pub struct Uploads {
    pub addr: SocketAddr,
    state: Arc<State>,
}

struct State {
    seen: Mutex<HashMap<String, Record>>,
    seed: u64,
}

/// The connection is dropped without an answer.
#[derive(Debug)]
struct Cut;

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cut on cue")
    }
}

impl std::error::Error for Cut {}

impl Uploads {
    /// Start one on a free loopback port; its random cut points come from
    /// `seed`.
    pub async fn start(seed: u64) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        let state = Arc::new(State {
            seen: Mutex::new(HashMap::new()),
            seed,
        });
        let accepting = Arc::clone(&state);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = Arc::clone(&accepting);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        handle(Arc::clone(&state), request)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, state }
    }

    /// The URL of `path` on this server.
    #[must_use]
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// What the server saw of upload `name`.
    #[must_use]
    pub fn record(&self, name: &str) -> Record {
        self.state
            .seen
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .unwrap_or_default()
    }
}

/// A number from the seed, the upload and the attempt (splitmix64).
fn random(seed: u64, name: &str, attempt: u32) -> u64 {
    let mut z = name
        .bytes()
        .fold(seed ^ u64::from(attempt).rotate_left(32), |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn query(q: &str, key: &str) -> Option<u64> {
    q.split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
}

#[allow(clippy::unnecessary_wraps)] // the service's result
fn answer(status: StatusCode) -> Result<Response<Full<Bytes>>, Cut> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    Ok(response)
}

#[allow(clippy::too_many_lines)] // one route per arm, read top to bottom
async fn handle(
    state: Arc<State>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Cut> {
    let path = request.uri().path().to_owned();
    let q = request.uri().query().unwrap_or("").to_owned();
    let Some((kind, name)) = path.trim_start_matches('/').split_once('/') else {
        return answer(StatusCode::NOT_FOUND);
    };
    let (kind, name) = (kind.to_owned(), name.to_owned());
    let attempt = {
        let mut seen = state.seen.lock().unwrap();
        let record = seen.entry(name.clone()).or_default();
        record.attempts += 1;
        record.attempts
    };
    let content_type = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let len = query(&q, "len").unwrap_or(0);
    let cuts = query(&q, "cuts").unwrap_or(0);
    let mut body = request.into_body();
    let bad = |why: String| {
        state.seen.lock().unwrap().get_mut(&name).unwrap().bad = Some(why);
        answer(StatusCode::BAD_REQUEST)
    };
    match kind.as_str() {
        "file" | "stream" => {
            let cut_at = (kind == "file" && u64::from(attempt) <= cuts)
                .then(|| random(state.seed, &name, attempt) % len.max(1));
            let mut offset = 0u64;
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else { return Err(Cut) };
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                for &b in &data {
                    if b != pattern(offset) {
                        return bad(format!("byte {offset} of attempt {attempt}"));
                    }
                    offset += 1;
                }
                if let Some(at) = cut_at
                    && offset >= at
                {
                    state
                        .seen
                        .lock()
                        .unwrap()
                        .get_mut(&name)
                        .unwrap()
                        .cut_at
                        .push(offset);
                    return Err(Cut);
                }
            }
            if offset != len {
                return bad(format!("{offset} bytes of {len} in attempt {attempt}"));
            }
            if kind == "stream" && u64::from(attempt) <= cuts {
                state
                    .seen
                    .lock()
                    .unwrap()
                    .get_mut(&name)
                    .unwrap()
                    .cut_at
                    .push(offset);
                return Err(Cut);
            }
            let status = query(&q, "status")
                .and_then(|s| StatusCode::from_u16(u16::try_from(s).ok()?).ok())
                .unwrap_or(StatusCode::OK);
            if status == StatusCode::OK {
                state.seen.lock().unwrap().get_mut(&name).unwrap().completed = Some(offset);
            }
            answer(status)
        }
        "multipart" => {
            let Ok(collected) = body.collect().await else {
                return Err(Cut);
            };
            let bytes = collected.to_bytes();
            let boundary = content_type
                .as_deref()
                .and_then(|ct| ct.strip_prefix("multipart/form-data; boundary="))
                .unwrap_or_default()
                .to_owned();
            state
                .seen
                .lock()
                .unwrap()
                .get_mut(&name)
                .unwrap()
                .boundaries
                .push(boundary.clone());
            if attempt == 1 {
                return answer(StatusCode::SERVICE_UNAVAILABLE);
            }
            let Some(part) = find(&bytes, b"name=\"report\"") else {
                return bad("no part named report".into());
            };
            let Some(start) = find(&bytes[part..], b"\r\n\r\n").map(|i| part + i + 4) else {
                return bad("no end of the part's headers".into());
            };
            let end = start + usize::try_from(len).unwrap();
            if boundary.is_empty()
                || find(&bytes, format!("--{boundary}\r\n").as_bytes()).is_none()
                || bytes.get(start..end) != Some(&pattern_bytes(len)[..])
                || !bytes[end..].starts_with(format!("\r\n--{boundary}").as_bytes())
            {
                return bad(format!("the form of attempt {attempt}"));
            }
            state.seen.lock().unwrap().get_mut(&name).unwrap().completed = Some(len);
            answer(StatusCode::OK)
        }
        _ => answer(StatusCode::NOT_FOUND),
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
