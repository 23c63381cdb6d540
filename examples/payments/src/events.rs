//! A flaky event-log server (gRPC `Subscribe`, a server stream read from a
//! cursor) for the resumable-stream tests and demo, and a `Work` call whose
//! handler counts the requests inside it (for the backpressure ones).
//!
//! Each `Subscribe` is one connection, scripted: refused at open
//! (`UNAVAILABLE` before any event), or some events already sent repeated
//! first (a server that resumes a little early), then a few new events, then
//! `UNAVAILABLE` mid-stream, or silence; the log's last event ends the stream
//! cleanly.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::transport::Server;
use tonic::{Request, Response, Status};

/// The generated protobuf and gRPC code.
#[allow(missing_docs, unreachable_pub, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("events");
}

use pb::events_server::{Events, EventsServer};
use pb::{Event, SubscribeRequest, UploadReply, WorkReply, WorkRequest};

/// How a connection ends when the log is not finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// `UNAVAILABLE` in the trailers, mid-stream.
    Unavailable,
    /// No more events, and the stream stays open.
    Silent,
}

/// What the server does on one `Subscribe`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connection {
    /// Answer `UNAVAILABLE` at once, sending nothing.
    pub refuse: bool,
    /// Events at or before the cursor sent again first.
    pub replay: u64,
    /// New events sent.
    pub events: u64,
    /// Then (unless the log ended).
    pub end: End,
}

impl Connection {
    /// `events` new events, then `UNAVAILABLE`.
    #[must_use]
    pub const fn new(events: u64) -> Self {
        Self {
            refuse: false,
            replay: 0,
            events,
            end: End::Unavailable,
        }
    }
}

/// The log and its script, shared by the server's handlers.
#[derive(Debug)]
pub struct Log {
    len: u64,
    gap: Duration,
    script: Mutex<VecDeque<Connection>>,
    opens: Mutex<Vec<Option<u64>>>,
    in_work: AtomicU32,
    max_in_work: AtomicU32,
    works: AtomicU32,
}

impl Log {
    /// Events `0..len`, one every `gap`, served by `script` (then by whole
    /// connections to the end).
    #[must_use]
    pub fn new(len: u64, gap: Duration, script: impl IntoIterator<Item = Connection>) -> Arc<Self> {
        Arc::new(Self {
            len,
            gap,
            script: Mutex::new(script.into_iter().collect()),
            opens: Mutex::default(),
            in_work: AtomicU32::new(0),
            max_in_work: AtomicU32::new(0),
            works: AtomicU32::new(0),
        })
    }

    /// A random script from `seed` (xorshift): a refusal one time in ten
    /// (never three in a row), up to 2 repeats, 1 to 8 new events, then
    /// `UNAVAILABLE`, or silence one time in twelve.
    #[must_use]
    pub fn random(len: u64, seed: u64) -> Arc<Self> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut script = Vec::new();
        let mut refusals = 0;
        for _ in 0..len {
            let refuse = refusals < 2 && next(10) == 0;
            refusals = if refuse { refusals + 1 } else { 0 };
            script.push(Connection {
                refuse,
                replay: next(3),
                events: 1 + next(8),
                end: if next(12) == 0 {
                    End::Silent
                } else {
                    End::Unavailable
                },
            });
        }
        Self::new(len, Duration::ZERO, script)
    }

    /// The cursor of every `Subscribe` so far (`None`: from the start).
    #[must_use]
    pub fn opens(&self) -> Vec<Option<u64>> {
        self.opens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The `Work` requests that reached the handler.
    #[must_use]
    pub fn works(&self) -> u32 {
        self.works.load(Ordering::SeqCst)
    }

    /// The most `Work` requests inside the handler at once.
    #[must_use]
    pub fn max_in_work(&self) -> u32 {
        self.max_in_work.load(Ordering::SeqCst)
    }
}

#[derive(Debug)]
struct Service {
    log: Arc<Log>,
}

type EventStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<Event, Status>> + Send>>;

#[tonic::async_trait]
impl Events for Service {
    type SubscribeStream = EventStream;

    async fn subscribe(
        &self,
        request: Request<SubscribeRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let r = request.into_inner();
        let after = r.resume.then_some(r.after);
        self.log.opens.lock().expect("opens").push(after);
        let conn = self
            .log
            .script
            .lock()
            .expect("script")
            .pop_front()
            .unwrap_or(Connection::new(u64::MAX));
        if conn.refuse {
            return Err(Status::unavailable("not now"));
        }
        let next = after.map_or(0, |c| c + 1);
        let first = next.saturating_sub(conn.replay);
        let end = next.saturating_add(conn.events).min(self.log.len);
        let finished = end == self.log.len;
        let gap = self.log.gap;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            for seq in first..end {
                if !gap.is_zero() {
                    tokio::time::sleep(gap).await;
                }
                if tx
                    .send(Ok(Event {
                        seq,
                        pad: Vec::new(),
                    }))
                    .await
                    .is_err()
                {
                    return; // the client left
                }
            }
            if finished {
                return; // a clean end: the log is complete
            }
            match conn.end {
                End::Unavailable => {
                    let _ = tx.send(Err(Status::unavailable("stream dropped"))).await;
                }
                End::Silent => tx.closed().await,
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn work(&self, request: Request<WorkRequest>) -> Result<Response<WorkReply>, Status> {
        self.log.works.fetch_add(1, Ordering::SeqCst);
        let n = self.log.in_work.fetch_add(1, Ordering::SeqCst) + 1;
        self.log.max_in_work.fetch_max(n, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(request.into_inner().millis)).await;
        self.log.in_work.fetch_sub(1, Ordering::SeqCst);
        Ok(Response::new(WorkReply { in_flight: n }))
    }

    async fn upload(
        &self,
        _: Request<tonic::Streaming<Event>>,
    ) -> Result<Response<UploadReply>, Status> {
        Err(Status::unimplemented("not here"))
    }
}

/// Open the event stream after `after` (from the first event with `None`):
/// the `open` function of a resumed stream.
pub fn subscribe(
    client: &pb::events_client::EventsClient<tonic::transport::Channel>,
    after: Option<u64>,
) -> impl Future<Output = Result<tonic::Streaming<Event>, Status>> + Send + use<> {
    let mut client = client.clone();
    async move {
        let request = SubscribeRequest {
            resume: after.is_some(),
            after: after.unwrap_or(0),
        };
        client
            .subscribe(request)
            .await
            .map(tonic::Response::into_inner)
    }
}

/// Serve `log` on a loopback port; with `shed`, behind a
/// [`retries_tower::ShedLayer`] of that many slots (pushback 100 ms).
///
/// # Panics
///
/// When no loopback port can be bound.
pub async fn serve(log: Arc<Log>, shed: Option<u32>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local address");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let service = EventsServer::new(Service { log });
    tokio::spawn(async move {
        let served = match shed {
            Some(slots) => {
                Server::builder()
                    .layer(retries_tower::ShedLayer::new(
                        slots,
                        Duration::from_millis(100),
                    ))
                    .add_service(service)
                    .serve_with_incoming(incoming)
                    .await
            }
            None => {
                Server::builder()
                    .add_service(service)
                    .serve_with_incoming(incoming)
                    .await
            }
        };
        served.expect("serve");
    });
    addr
}
