//! The bounded outbox (`retries::stream::outbox`) as a tonic
//! server-streaming response, on loopback: 100,000 events sent as fast as
//! the producer can to a client that reads slowly, for each overflow rule.
//! The queue never holds more than its capacity (the sender is held back,
//! refused or made to drop, as the rule says), and every event is accounted
//! for exactly once: received by the client, dropped, or refused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use retries::stream::{OutboxStats, Overflow, Receiver, SendError, outbox};
use retries_payments::events::pb::events_client::EventsClient;
use retries_payments::events::pb::events_server::{Events, EventsServer};
use retries_payments::events::pb::{Event, SubscribeRequest, WorkReply, WorkRequest};
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

const N: u64 = 100_000;
const CAPACITY: usize = 64;

/// A server whose `Subscribe` streams `N` events through an outbox.
struct Flood {
    overflow: Overflow,
    /// The producer's view when it finished: its stats and the sends it saw
    /// refused.
    done: Arc<Mutex<Option<(OutboxStats, u64)>>>,
}

#[tonic::async_trait]
impl Events for Flood {
    type SubscribeStream = Receiver<Result<Event, Status>>;

    async fn subscribe(
        &self,
        _: Request<SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let (tx, rx) = outbox(CAPACITY, self.overflow).expect("a capacity above zero");
        let done = Arc::clone(&self.done);
        tokio::spawn(async move {
            let mut refused = 0;
            for seq in 0..N {
                match tx.send(Ok(Event { seq })).await {
                    Ok(()) => {}
                    Err(SendError::Full(_)) => refused += 1,
                    Err(SendError::Closed(_)) => panic!("the client left at {seq}"),
                }
                if seq % 256 == 0 {
                    // Let the runtime breathe (a producer that never awaits
                    // would hold its worker thread).
                    tokio::task::yield_now().await;
                }
            }
            *done.lock().unwrap() = Some((tx.stats(), refused));
        });
        Ok(Response::new(rx))
    }

    async fn work(&self, _: Request<WorkRequest>) -> Result<Response<WorkReply>, Status> {
        Err(Status::unimplemented("not here"))
    }
}

/// Serve a flood under `overflow`; read it slowly; return what the client
/// got (in order, checked) and the producer's view.
async fn flood(overflow: Overflow) -> (Vec<u64>, OutboxStats, u64) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let done = Arc::new(Mutex::new(None));
    let service = EventsServer::new(Flood {
        overflow,
        done: Arc::clone(&done),
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
    let mut stream = EventsClient::new(channel)
        .subscribe(SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    while let Some(event) = stream.message().await.unwrap() {
        got.push(event.seq);
        if got.len() % 500 == 0 {
            // A slow reader: 1 ms every 500 events.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    assert!(got.windows(2).all(|w| w[0] < w[1]), "in order, no repeats");
    let (stats, refused) = done.lock().unwrap().take().expect("the producer finished");
    (got, stats, refused)
}

fn check(overflow: Overflow, got: &[u64], stats: &OutboxStats, refused: u64) {
    assert!(
        stats.max_len <= CAPACITY,
        "{overflow:?}: the queue held {} > {CAPACITY}",
        stats.max_len
    );
    // The producer's view when it finished: what the receiver had taken,
    // what was still queued (delivered after), dropped and refused.
    let queued = stats.len as u64;
    assert_eq!(stats.received + queued, got.len() as u64, "{overflow:?}");
    assert_eq!(stats.refused, refused, "{overflow:?}");
    assert_eq!(
        stats.received + queued + stats.dropped + stats.refused,
        N,
        "{overflow:?}: every event accounted for once: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_delivers_every_event_to_a_slow_client() {
    let overflow = Overflow::Wait(Duration::from_secs(10));
    let (got, stats, refused) = flood(overflow).await;
    check(overflow, &got, &stats, refused);
    assert_eq!(got, (0..N).collect::<Vec<_>>());
    assert_eq!(stats.max_len, CAPACITY, "the slow client filled the queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_refuses_what_does_not_fit() {
    let (got, stats, refused) = flood(Overflow::Reject).await;
    check(Overflow::Reject, &got, &stats, refused);
    assert!(refused > 0, "the slow client made the producer refuse");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_oldest_keeps_the_newest() {
    let (got, stats, refused) = flood(Overflow::DropOldest).await;
    check(Overflow::DropOldest, &got, &stats, refused);
    assert!(stats.dropped > 0);
    assert_eq!(got.last(), Some(&(N - 1)), "the newest event arrives");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_newest_keeps_the_first() {
    let (got, stats, refused) = flood(Overflow::DropNewest).await;
    check(Overflow::DropNewest, &got, &stats, refused);
    assert!(stats.dropped > 0);
    assert_eq!(
        got[..CAPACITY],
        (0..CAPACITY as u64).collect::<Vec<_>>()[..]
    );
}
