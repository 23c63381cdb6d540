//! The outbox's books under `loom` (CI: `RUSTFLAGS="--cfg loom" cargo test
//! -p retries-core --lib --release loom`): a receiver waiting is woken by
//! the send that fills it and by the last sender leaving (no lost wake-up,
//! or `loom` reports the model stuck), and concurrent sends into a full
//! queue count each item once.

use std::future::poll_fn;
use std::pin::Pin;

use loom::future::block_on;
use loom::thread;

use super::*;

/// An outbox, its `loom` lock made on this thread before any other thread
/// is spawned.
fn made(capacity: usize, overflow: Overflow) -> (Sender<u32>, Receiver<u32>) {
    let (tx, rx) = outbox(capacity, overflow).unwrap();
    let _ = tx.stats();
    (tx, rx)
}

fn next(rx: &mut Receiver<u32>) -> Option<u32> {
    block_on(poll_fn(|cx| Pin::new(&mut *rx).poll_next(cx)))
}

/// The receiver waits on an empty queue while another thread sends and
/// leaves: it gets the item, then the end.
#[test]
fn loom_a_waiting_receiver_is_woken_by_the_send_and_the_last_sender() {
    loom::model(|| {
        let (tx, mut rx) = made(2, Overflow::Reject);
        let t = thread::spawn(move || {
            tx.try_send(7).unwrap();
            drop(tx);
        });
        assert_eq!(next(&mut rx), Some(7));
        assert_eq!(next(&mut rx), None);
        t.join().unwrap();
        let stats = rx.stats();
        assert_eq!((stats.queued, stats.received, stats.len), (1, 1, 0));
    });
}

/// Two senders race into a queue of one that drops its oldest item: both
/// are queued, one is dropped, the queue never holds two.
#[test]
fn loom_racing_sends_into_a_full_queue_count_each_item_once() {
    loom::model(|| {
        let (tx, mut rx) = made(1, Overflow::DropOldest);
        let other = tx.clone();
        let t = thread::spawn(move || other.try_send(1).unwrap());
        tx.try_send(2).unwrap();
        t.join().unwrap();
        drop(tx);
        let stats = rx.stats();
        assert_eq!(
            (stats.queued, stats.dropped, stats.len, stats.max_len),
            (2, 1, 1, 1)
        );
        let last = next(&mut rx).unwrap();
        assert!(last == 1 || last == 2);
        assert_eq!(next(&mut rx), None);
    });
}
