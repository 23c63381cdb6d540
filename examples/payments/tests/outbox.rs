//! The bounded outbox (`retries::stream::outbox`) on tonic over loopback,
//! as it plugs in: a server-streaming response (`Receiver<Result<T,
//! Status>>`) and a client-streaming request (`Receiver<T>`). 100,000 events
//! are sent as fast as the producer can to a side that reads slowly, for
//! each overflow rule. The queue never holds more than its capacity (the
//! sender is held back, refused or made to drop, as the rule says), every
//! event is accounted for exactly once (received, dropped or refused), and
//! the memory the flood holds stays flat: measured by a counting allocator
//! against the same flood through an unbounded channel.
//!
//! A test binary of its own, whose tests run one at a time: the allocator
//! counts the whole process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use retries::stream::{OutboxStats, Overflow, SendError, outbox};
use retries_payments::events::pb::events_client::EventsClient;
use retries_payments::events::pb::events_server::{Events, EventsServer};
use retries_payments::events::pb::{Event, SubscribeRequest, UploadReply, WorkReply, WorkRequest};
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

const N: u64 = 100_000;
const CAPACITY: usize = 64;
/// Each event carries this many bytes besides its number, so that a queue
/// that grows shows in the memory held (25.6 MB for all of them).
const PAD: usize = 256;

fn event(seq: u64) -> Event {
    Event {
        seq,
        pad: vec![0; PAD],
    }
}

/// Counts the bytes the process holds, and the most it held since
/// [`Peak::start`].
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only
// counters are updated besides.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The most bytes held above what was held at its start.
struct Peak(usize);

impl Peak {
    fn start() -> Self {
        let live = LIVE.load(Ordering::Relaxed);
        PEAK.store(live, Ordering::Relaxed);
        Self(live)
    }

    fn above(&self) -> usize {
        PEAK.load(Ordering::Relaxed).saturating_sub(self.0)
    }
}

/// One test at a time: the allocator counts the whole process.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What a producer saw when it finished: its stats and the sends refused.
type Done = Arc<Mutex<Option<(OutboxStats, u64)>>>;

/// Send `N` events through `tx` as fast as the rules let it.
async fn produce<T>(tx: retries::stream::Sender<T>, item: impl Fn(u64) -> T, done: &Done) {
    let mut refused = 0;
    for seq in 0..N {
        match tx.send(item(seq)).await {
            Ok(()) => {}
            Err(SendError::Full(_)) => refused += 1,
            Err(SendError::Closed(_)) => panic!("the other side left at {seq}"),
        }
        if seq.is_multiple_of(256) {
            // Let the runtime breathe (a producer that never awaits would
            // hold its worker thread).
            tokio::task::yield_now().await;
        }
    }
    *done.lock().unwrap() = Some((tx.stats(), refused));
}

/// Read slowly: 1 ms every 500 events.
async fn pace(got: usize) {
    if got.is_multiple_of(500) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

type EventStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<Event, Status>> + Send>>;

/// A server whose `Subscribe` streams `N` events through an outbox (or,
/// with no rule, an unbounded channel: the baseline), and whose `Upload`
/// reads a client's stream slowly.
struct Flood {
    overflow: Option<Overflow>,
    done: Done,
    uploaded: Arc<Mutex<Vec<u64>>>,
}

#[tonic::async_trait]
impl Events for Flood {
    type SubscribeStream = EventStream;

    async fn subscribe(
        &self,
        _: Request<SubscribeRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let done = Arc::clone(&self.done);
        let Some(overflow) = self.overflow else {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(async move {
                for seq in 0..N {
                    tx.send(Ok(event(seq))).expect("the client reads");
                    if seq.is_multiple_of(256) {
                        tokio::task::yield_now().await;
                    }
                }
                *done.lock().unwrap() = Some((OutboxStats::default(), 0));
            });
            return Ok(Response::new(Box::pin(
                tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
            )));
        };
        let (tx, rx) = outbox(CAPACITY, overflow).expect("a capacity above zero");
        tokio::spawn(async move { produce(tx, |seq| Ok(event(seq)), &done).await });
        Ok(Response::new(Box::pin(rx)))
    }

    async fn work(&self, _: Request<WorkRequest>) -> Result<Response<WorkReply>, Status> {
        Err(Status::unimplemented("not here"))
    }

    async fn upload(
        &self,
        request: Request<tonic::Streaming<Event>>,
    ) -> Result<Response<UploadReply>, Status> {
        let mut stream = request.into_inner();
        // The list made before the flood (its 800 KB are not the flood's).
        let mut got = std::mem::take(&mut *self.uploaded.lock().unwrap());
        while let Some(event) = stream.message().await? {
            got.push(event.seq);
            pace(got.len()).await;
        }
        let count = got.len() as u64;
        *self.uploaded.lock().unwrap() = got;
        Ok(Response::new(UploadReply { count }))
    }
}

/// A server for `overflow` on loopback, and a client connected to it.
async fn serve(overflow: Option<Overflow>) -> (EventsClient<Channel>, Done, Arc<Mutex<Vec<u64>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let done = Done::default();
    let uploaded = Arc::new(Mutex::new(Vec::with_capacity(N as usize)));
    let service = EventsServer::new(Flood {
        overflow,
        done: Arc::clone(&done),
        uploaded: Arc::clone(&uploaded),
    });
    tokio::spawn(
        Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (EventsClient::new(channel), done, uploaded)
}

/// What one flood left: the events the slow side got (in order, checked),
/// the producer's view, and the most bytes held during it.
struct Run {
    got: Vec<u64>,
    stats: OutboxStats,
    refused: u64,
    peak: usize,
}

/// The server streams a flood under `overflow` to a client that reads
/// slowly.
async fn flood(overflow: Option<Overflow>) -> Run {
    let (mut client, done, _) = serve(overflow).await;
    let mut got = Vec::with_capacity(N as usize);
    let peak = Peak::start();
    let mut stream = client
        .subscribe(SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    while let Some(event) = stream.message().await.unwrap() {
        got.push(event.seq);
        pace(got.len()).await;
    }
    let peak = peak.above();
    assert!(got.windows(2).all(|w| w[0] < w[1]), "in order, no repeats");
    let (stats, refused) = done.lock().unwrap().take().expect("the producer finished");
    Run {
        got,
        stats,
        refused,
        peak,
    }
}

/// The client streams a flood under `overflow` as its request to a server
/// that reads slowly.
async fn upload(overflow: Overflow) -> Run {
    let (mut client, done, uploaded) = serve(None).await;
    let peak = Peak::start();
    let (tx, rx) = outbox(CAPACITY, overflow).expect("a capacity above zero");
    let producer = {
        let done = Arc::clone(&done);
        tokio::spawn(async move { produce(tx, event, &done).await })
    };
    let reply = client.upload(rx).await.unwrap().into_inner();
    producer.await.unwrap();
    let peak = peak.above();
    let got = std::mem::take(&mut *uploaded.lock().unwrap());
    assert_eq!(reply.count, got.len() as u64);
    assert!(got.windows(2).all(|w| w[0] < w[1]), "in order, no repeats");
    let (stats, refused) = done.lock().unwrap().take().expect("the producer finished");
    Run {
        got,
        stats,
        refused,
        peak,
    }
}

/// The bytes a flood may hold in all: its queue of 64 events (16 KB),
/// tonic's, hyper's and h2's buffers and what the runtime allocates on the
/// way (0.4 to 3.3 MB measured, by rule and direction), against 22 to
/// 25 MB for the same flood through an unbounded channel. The bound, 6 MiB,
/// is under a quarter of the 25.6 MB the flood carries.
const FLAT: usize = 6 << 20;

fn check(overflow: Overflow, run: &Run) {
    let Run {
        got,
        stats,
        refused,
        peak,
    } = run;
    assert!(
        stats.max_len <= CAPACITY,
        "{overflow:?}: the queue held {} > {CAPACITY}",
        stats.max_len
    );
    // The producer's view when it finished: what the receiver had taken,
    // what was still queued (delivered after), dropped and refused.
    let queued = stats.len as u64;
    assert_eq!(stats.received + queued, got.len() as u64, "{overflow:?}");
    assert_eq!(stats.refused, *refused, "{overflow:?}");
    assert_eq!(
        stats.received + queued + stats.dropped + stats.refused,
        N,
        "{overflow:?}: every event accounted for once: {stats:?}"
    );
    assert!(
        *peak < FLAT,
        "{overflow:?}: {peak} bytes held during the flood"
    );
}

const RULES: [Overflow; 4] = [
    Overflow::Wait(Duration::from_secs(10)),
    Overflow::Reject,
    Overflow::DropOldest,
    Overflow::DropNewest,
];

/// What each rule must show beyond the shared checks.
fn by_rule(overflow: Overflow, run: &Run) {
    match overflow {
        Overflow::Wait(_) => {
            assert_eq!(run.got, (0..N).collect::<Vec<_>>());
            assert_eq!(
                run.stats.max_len, CAPACITY,
                "the slow side filled the queue"
            );
        }
        Overflow::Reject => assert!(run.refused > 0, "the slow side made the producer refuse"),
        Overflow::DropOldest => {
            assert!(run.stats.dropped > 0);
            assert_eq!(run.got.last(), Some(&(N - 1)), "the newest event arrives");
        }
        Overflow::DropNewest => {
            assert!(run.stats.dropped > 0);
            assert_eq!(
                run.got[..CAPACITY],
                (0..CAPACITY as u64).collect::<Vec<_>>()[..]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stream_to_a_slow_client_under_every_rule() {
    let _one = SERIAL.lock().await;
    for overflow in RULES {
        let run = flood(Some(overflow)).await;
        check(overflow, &run);
        by_rule(overflow, &run);
        eprintln!("server stream, {overflow:?}: {} bytes at most", run.peak);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stream_to_a_slow_server_under_every_rule() {
    let _one = SERIAL.lock().await;
    for overflow in RULES {
        let run = upload(overflow).await;
        check(overflow, &run);
        by_rule(overflow, &run);
        eprintln!("client stream, {overflow:?}: {} bytes at most", run.peak);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unbounded_channel_holds_the_flood_the_outbox_does_not() {
    // The same flood through an unbounded channel: the measure is able to
    // see a queue that grows, and the outbox's flat figure means something.
    let _one = SERIAL.lock().await;
    let unbounded = flood(None).await;
    assert_eq!(unbounded.got, (0..N).collect::<Vec<_>>());
    let bounded = flood(Some(Overflow::Wait(Duration::from_secs(10)))).await;
    eprintln!(
        "unbounded: {} bytes at most; outbox (Wait): {}",
        unbounded.peak, bounded.peak
    );
    assert!(
        unbounded.peak > 4 * bounded.peak,
        "unbounded {} vs outbox {}",
        unbounded.peak,
        bounded.peak
    );
}
