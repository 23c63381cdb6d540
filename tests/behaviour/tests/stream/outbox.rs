//! The bounded outbox of `retries::stream` on the paused clock: each
//! overflow rule with exact counts (every item received, queued, dropped or
//! refused, exactly once), the wait bounded by its limit and by the
//! deadline of the call it runs in, a gone receiver, the end of the stream,
//! and a zero capacity refused.

use std::time::Duration;

use futures_util::StreamExt;
use retries::stream::{OutboxError, OutboxStats, Overflow, SendError, outbox};
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Every item given to a send is exactly one of these.
fn accounted(s: &OutboxStats) -> u64 {
    s.received + s.len as u64 + s.dropped + s.refused
}

#[test]
fn a_zero_capacity_is_a_typed_error() {
    assert_eq!(
        outbox::<u8>(0, Overflow::Reject).unwrap_err(),
        OutboxError::ZeroCapacity
    );
}

#[tokio::test(start_paused = true)]
async fn reject_hands_the_item_back_at_once() {
    let (tx, mut rx) = outbox(3, Overflow::Reject).unwrap();
    let mut refused = Vec::new();
    for i in 0..10 {
        if let Err(SendError::Full(back)) = tx.send(i).await {
            refused.push(back);
        }
    }
    assert_eq!(refused, (3..10).collect::<Vec<_>>());
    drop(tx);
    let got: Vec<i32> = rx.by_ref().collect().await;
    assert_eq!(got, [0, 1, 2]);
    let s = rx.stats();
    assert_eq!(
        (s.queued, s.received, s.dropped, s.refused, s.max_len),
        (3, 3, 0, 7, 3)
    );
    assert_eq!(accounted(&s), 10);
}

#[tokio::test(start_paused = true)]
async fn drop_oldest_keeps_the_newest_and_counts_the_rest() {
    let (tx, mut rx) = outbox(3, Overflow::DropOldest).unwrap();
    for i in 0..10 {
        tx.send(i).await.unwrap();
    }
    drop(tx);
    let got: Vec<i32> = rx.by_ref().collect().await;
    assert_eq!(got, [7, 8, 9]);
    let s = rx.stats();
    assert_eq!(
        (s.queued, s.received, s.dropped, s.refused, s.max_len),
        (10, 3, 7, 0, 3)
    );
    assert_eq!(accounted(&s), 10);
}

#[tokio::test(start_paused = true)]
async fn drop_newest_keeps_the_first_and_counts_the_rest() {
    let (tx, mut rx) = outbox(3, Overflow::DropNewest).unwrap();
    for i in 0..10 {
        tx.send(i).await.unwrap();
    }
    drop(tx);
    let got: Vec<i32> = rx.by_ref().collect().await;
    assert_eq!(got, [0, 1, 2]);
    let s = rx.stats();
    assert_eq!((s.queued, s.received, s.dropped, s.refused), (3, 3, 7, 0));
    assert_eq!(accounted(&s), 10);
}

#[tokio::test(start_paused = true)]
async fn wait_takes_the_room_a_slow_receiver_makes() {
    // A receiver that takes one item every 10 ms; a sender of 20 items
    // into 2 slots, each send waiting up to 50 ms: nothing is lost, the
    // queue never holds more than 2, and the sender is paced by the reader.
    let (tx, mut rx) = outbox(2, Overflow::Wait(ms(50))).unwrap();
    let t0 = Instant::now();
    let producer = tokio::spawn(async move {
        for i in 0..20 {
            tx.send(i).await.unwrap();
        }
        tx.stats()
    });
    let mut got = Vec::new();
    while let Some(i) = rx.next().await {
        got.push(i);
        tokio::time::sleep(ms(10)).await;
    }
    assert_eq!(got, (0..20).collect::<Vec<_>>());
    let s = producer.await.unwrap();
    assert_eq!((s.refused, s.dropped, s.max_len), (0, 0, 2));
    // The last item was taken at 190 ms (one every 10 ms from 0).
    assert_eq!(t0.elapsed(), ms(200));
}

#[tokio::test(start_paused = true)]
async fn wait_gives_up_at_its_bound_with_the_item() {
    let (tx, rx) = outbox(1, Overflow::Wait(ms(50))).unwrap();
    tx.send(1).await.unwrap();
    let t0 = Instant::now();
    assert_eq!(tx.send(2).await, Err(SendError::Full(2)));
    assert_eq!(t0.elapsed(), ms(50));
    let s = rx.stats();
    assert_eq!((s.queued, s.refused, s.len), (1, 1, 1));
}

#[tokio::test(start_paused = true)]
async fn wait_never_passes_the_deadline_of_the_call_it_runs_in() {
    // Under a deadline 30 ms away (a retried call's attempt, a server's
    // caller), a 50 ms wait gives up at 30 ms with the item.
    let (tx, rx) = outbox(1, Overflow::Wait(ms(50))).unwrap();
    tx.send(1).await.unwrap();
    let t0 = Instant::now();
    let sent = retries::scope::with_deadline((t0 + ms(30)).into_std(), tx.send(2)).await;
    assert_eq!(sent, Err(SendError::Full(2)));
    assert_eq!(t0.elapsed(), ms(30));
    assert_eq!(rx.stats().len, 1);
}

#[tokio::test(start_paused = true)]
async fn a_gone_receiver_fails_every_send_with_its_item() {
    let (tx, rx) = outbox(1, Overflow::Wait(ms(1000))).unwrap();
    tx.send(1).await.unwrap();
    let waiting = tokio::spawn({
        let tx = tx.clone();
        async move { tx.send(2).await }
    });
    tokio::time::sleep(ms(10)).await;
    drop(rx);
    let t0 = Instant::now();
    assert_eq!(waiting.await.unwrap(), Err(SendError::Closed(2)));
    assert_eq!(
        t0.elapsed(),
        Duration::ZERO,
        "woken at once, not at its bound"
    );
    assert_eq!(tx.send(3).await, Err(SendError::Closed(3)));
    assert_eq!(tx.stats().refused, 2);
}

#[tokio::test(start_paused = true)]
async fn the_stream_ends_when_every_sender_is_gone_and_the_queue_is_empty() {
    let (tx, mut rx) = outbox(4, Overflow::Reject).unwrap();
    let second = tx.clone();
    tx.send(1).await.unwrap();
    second.send(2).await.unwrap();
    drop(tx);
    assert_eq!(rx.next().await, Some(1));
    let reader = tokio::spawn(async move {
        let mut rest = Vec::new();
        while let Some(i) = rx.next().await {
            rest.push(i);
        }
        rest
    });
    tokio::time::sleep(ms(10)).await;
    second.send(3).await.unwrap();
    drop(second);
    assert_eq!(reader.await.unwrap(), [2, 3]);
}

/// A send cancelled before it returns, at every point it can be: never
/// polled, and waiting for room (a timeout). Each cancelled item is
/// counted as dropped, so every item given to a send is still exactly one
/// of received, queued, dropped or refused.
#[tokio::test(start_paused = true)]
async fn the_books_balance_after_cancelled_sends() {
    let (tx, mut rx) =
        retries::stream::outbox::<u32>(2, Overflow::Wait(Duration::from_secs(10))).unwrap();
    tx.send(1).await.unwrap();
    tx.send(2).await.unwrap();
    // Waiting for room, cancelled by a 50 ms timeout.
    let waited = tokio::time::timeout(Duration::from_millis(50), tx.send(3)).await;
    assert!(waited.is_err(), "still waiting when cancelled");
    // Never polled.
    drop(tx.send(4));
    let given = 4;
    let s = tx.stats();
    assert_eq!((s.queued, s.dropped, s.refused, s.received), (2, 2, 0, 0));
    assert_eq!(
        s.received + s.len as u64 + s.dropped + s.refused,
        given,
        "{s:?}"
    );
    // The queue is as it was: the two queued items, in order.
    assert_eq!(rx.next().await, Some(1));
    assert_eq!(rx.next().await, Some(2));
    // A send that completes is counted once, as queued.
    tx.send(5).await.unwrap();
    let s = tx.stats();
    assert_eq!((s.queued, s.dropped, s.received), (3, 2, 2), "{s:?}");
}
