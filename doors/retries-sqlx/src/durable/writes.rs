//! The writes every call makes, batched: an attempt's mark (written
//! before it is sent) and a call's end as done. Each caller waits for its
//! own write's answer; the writes queued while one batch is in flight go
//! in the next, one statement per kind. A worker of 32 calls at once then
//! makes about two round trips per batch instead of one per call.

use std::cell::RefCell;
use std::collections::HashSet;

use sqlx_postgres::PgPool;
use tokio::sync::{Notify, oneshot};

use super::sql;

/// What a write is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// An attempt starts: `started`, `attempts + 1`.
    Start,
    /// The call is done.
    Done,
}

type Reply = oneshot::Sender<Result<bool, String>>;

/// The queue of writes, and the writer that drains it (run by the
/// worker's loop beside its calls).
#[derive(Default)]
pub(super) struct Writes {
    queue: RefCell<Vec<(Kind, i64, i64, Reply)>>,
    wake: Notify,
}

impl Writes {
    /// Write `kind` for call `id` under `lease`: `Ok(true)` written,
    /// `Ok(false)` fenced (the lease is another worker's, or the call has
    /// ended), `Err` the database's error (nothing known written).
    pub(super) async fn write(&self, kind: Kind, id: i64, lease: i64) -> Result<bool, String> {
        let (tx, rx) = oneshot::channel();
        self.queue.borrow_mut().push((kind, id, lease, tx));
        self.wake.notify_one();
        rx.await
            .unwrap_or_else(|_| Err("the worker stopped before the write".to_owned()))
    }

    /// Drain the queue forever, a batch per kind at a time.
    pub(super) async fn run(&self, pool: &PgPool) {
        loop {
            self.wake.notified().await;
            loop {
                let batch = std::mem::take(&mut *self.queue.borrow_mut());
                if batch.is_empty() {
                    break;
                }
                let (starts, dones): (Vec<_>, Vec<_>) =
                    batch.into_iter().partition(|w| w.0 == Kind::Start);
                tokio::join!(
                    flush(pool, sql::START_MANY, starts),
                    flush(pool, sql::DONE_MANY, dones)
                );
            }
        }
    }
}

/// One statement for `writes`, each told whether its row was written.
async fn flush(pool: &PgPool, statement: &'static str, writes: Vec<(Kind, i64, i64, Reply)>) {
    if writes.is_empty() {
        return;
    }
    let ids: Vec<i64> = writes.iter().map(|w| w.1).collect();
    let leases: Vec<i64> = writes.iter().map(|w| w.2).collect();
    let written: Result<Vec<(i64,)>, _> = sqlx_core::query_as::query_as(statement)
        .bind(&ids)
        .bind(&leases)
        .fetch_all(pool)
        .await;
    match written {
        Ok(rows) => {
            let written: HashSet<i64> = rows.into_iter().map(|r| r.0).collect();
            for (_, id, _, reply) in writes {
                let _ = reply.send(Ok(written.contains(&id)));
            }
        }
        Err(e) => {
            let e = e.to_string();
            for (.., reply) in writes {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}
