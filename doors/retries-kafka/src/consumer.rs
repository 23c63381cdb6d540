//! The consumer's side of the runner: its context on rebalances (commit
//! before revocation), the errors it may meet (which heal, which end the
//! run), and outages waited out.

use crate::{later, lock, millis};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use retries::Backoff;

/// The write can never succeed as it is: the record (with the runner's
/// headers) is over a size limit, the producer's or the broker's.
pub(crate) fn too_large(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        e.rdkafka_error_code(),
        Some(Code::MessageSizeTooLarge | Code::InvalidMessageSize)
    )
}

pub(crate) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// The consumer cannot go on whatever happens next: credentials or
/// authorisation (a configuration error; it does not heal by waiting).
pub(crate) fn cannot_heal(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        e.rdkafka_error_code(),
        Some(
            Code::Authentication
                | Code::SaslAuthenticationFailed
                | Code::TopicAuthorizationFailed
                | Code::GroupAuthorizationFailed
                | Code::ClusterAuthorizationFailed
                | Code::Fatal
        )
    )
}

/// Not the broker's error but the runner's: the consumer was not polled
/// within `max.poll.interval.ms`.
pub(crate) fn too_slow(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(rdkafka::types::RDKafkaErrorCode::PollExceeded)
    )
}

pub(crate) fn unknown_topic(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        e.rdkafka_error_code(),
        Some(Code::UnknownTopicOrPartition | Code::UnknownTopic | Code::UnknownPartition)
    )
}

/// An episode of errors from the broker (down, restarting, a coordinator
/// moving, a write not acknowledged): logged when it starts and when it
/// ends, waited out between tries with the runner's backoff (the engine's
/// [`Backoff`], pause `n` for the `n`-th error in a row).
#[derive(Debug)]
pub(crate) struct Outage {
    backoff: Backoff,
    /// What fails: "the consumer", "a write".
    what: &'static str,
    /// Errors in a row.
    errors: u32,
    since: Option<Instant>,
    prev: Duration,
    /// Not before this instant, the next try.
    pub(crate) until: Option<Instant>,
}

impl Outage {
    pub(crate) fn new(backoff: Backoff, what: &'static str) -> Self {
        Self {
            backoff,
            what,
            errors: 0,
            since: None,
            prev: Duration::ZERO,
            until: None,
        }
    }

    /// One more error: the first of an episode is logged (WARN), the rest
    /// only at DEBUG; the next try waits the backoff's next pause.
    pub(crate) fn begin(&mut self, e: &KafkaError) {
        self.errors = self.errors.saturating_add(1);
        if self.since.is_none() {
            self.since = Some(Instant::now());
            if too_slow(e) {
                // Not the broker's: the run loop did not poll for longer
                // than `max.poll.interval.ms`, and the group reassigns this
                // consumer's partitions.
                tracing::warn!(target: "retries_kafka", what = self.what, error = %e, "too slow: the consumer was not polled within max.poll.interval.ms (every slot taken by slow handlers, or a handler blocking its thread); the group reassigns its partitions");
            } else {
                tracing::warn!(target: "retries_kafka", what = self.what, error = %e, "broker error: waiting it out");
            }
        } else {
            tracing::debug!(target: "retries_kafka", what = self.what, error = %e, errors = self.errors, "broker error");
        }
        self.prev = self.backoff.delay(self.errors, self.prev);
        self.until = Some(later(self.prev));
    }

    /// How long the episode has lasted.
    pub(crate) fn lasted(&self) -> Duration {
        self.since.map_or(Duration::ZERO, |s| s.elapsed())
    }

    /// A try succeeded: the episode, if any, is over.
    pub(crate) fn over(&mut self) {
        if let Some(since) = self.since.take() {
            tracing::info!(target: "retries_kafka", what = self.what, errors = self.errors, lasted_ms = millis(since.elapsed()), "broker error over");
        }
        self.errors = 0;
        self.prev = Duration::ZERO;
        self.until = None;
    }
}

/// The consumer's context: on a rebalance, before partitions are revoked,
/// the offsets finished on them are committed (synchronously: the next owner
/// starts where this one stopped), and the revoked partitions are noted for
/// the run loop to forget their pauses, wake-ups, queues and in-flight
/// records.
#[derive(Debug, Clone, Default)]
pub(crate) struct Rebalances {
    /// Next offsets to commit, by partition: each is past finished records
    /// only.
    pub(crate) finished: Arc<Mutex<HashMap<(String, i32), i64>>>,
    /// Partitions revoked since the run loop last looked.
    pub(crate) revoked: Arc<Mutex<Vec<(String, i32)>>>,
    /// The consumer's `client.id`, for the logs.
    pub(crate) name: String,
    /// Since when a commit is in flight (cleared when it returns): the
    /// offsets finished meanwhile wait for the next one.
    pub(crate) committing: Arc<Mutex<Option<Instant>>>,
    /// A commit returned: the run loop commits what finished meanwhile.
    pub(crate) commit_done: Arc<tokio::sync::Notify>,
}

impl ClientContext for Rebalances {}

impl ConsumerContext for Rebalances {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let gone: Vec<(String, i32)> = tpl
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        let mut commit = TopicPartitionList::new();
        {
            let mut finished = lock(&self.finished);
            for at in &gone {
                if let Some(next) = finished.remove(at) {
                    let _ = commit.add_partition_offset(&at.0, at.1, Offset::Offset(next));
                }
            }
        }
        if commit.count() > 0
            && let Err(e) = consumer.commit(&commit, CommitMode::Sync)
        {
            tracing::debug!(target: "retries_kafka", error = %e, "commit before a rebalance failed");
        }
        // A rebalance is rare and changes what this consumer reads: INFO,
        // as Kafka's own clients log it.
        if !gone.is_empty() {
            tracing::info!(target: "retries_kafka", client = self.name, partitions = i64::try_from(gone.len()).unwrap_or(i64::MAX), "partitions revoked");
        }
        lock(&self.revoked).extend(gone);
    }

    fn commit_callback(&self, result: rdkafka::error::KafkaResult<()>, _: &TopicPartitionList) {
        if let Err(e) = result {
            // The next commit of each partition covers its offsets; until
            // then a crash re-reads those records (at least once).
            tracing::debug!(target: "retries_kafka", client = self.name, error = %e, "commit failed");
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        // librdkafka keeps a partition's pause across a revocation: one
        // paused here before (for a record not due, the breaker, a full
        // queue) would come back paused, with nothing left to resume it.
        // The run loop has forgotten those pauses; the new assignment starts
        // unpaused, from the committed offsets.
        let Rebalance::Assign(tpl) = rebalance else {
            return;
        };
        tracing::debug!(target: "retries_kafka", client = self.name, partitions = tpl.count(), "partitions assigned");
        if let Err(e) = consumer.resume(tpl) {
            tracing::debug!(target: "retries_kafka", error = %e, "resume after an assignment failed");
        }
    }
}
