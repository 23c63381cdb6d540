//! Redrive (issue 62, item 4): the dead-letter topic's records sent again
//! by an operator, at the operator's rate, each under its original key and
//! marked so that a non-idempotent handler's `reconcile` runs first.

use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Headers;
use rdkafka::producer::FutureProducer;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use crate::runner::{Whole, Worker};
use crate::{Error, RetryTopics, now_ms};

impl RetryTopics {
    /// Send the dead-letter topic's records again, at most `per_second`,
    /// until none has come for `idle` (the topic read to its end), and
    /// return how many were sent. Each goes to the first retry topic
    /// (due at once), with its original coordinates (so its idempotency
    /// key, derived from them, is the one it was dead-lettered with), a
    /// new first-seen time (a whole record deadline again) and the mark
    /// `retries-cut: redrive`: its next owner treats the earlier run as an
    /// unknown outcome, so a non-idempotent handler's `reconcile` is asked
    /// before the handler runs again (without `reconcile`, it is dead
    /// again, `unknown_outcome`); an idempotent handler runs it again
    /// under its key. The runner must have a retry topic.
    ///
    /// The dead-letter topic is read by the consumer group `GROUP-redrive`
    /// (its offsets committed as records are sent), so a redrive stopped
    /// midway resumes where it stopped, and one run twice sends nothing
    /// twice. A dead letter written without its payload (too large for the
    /// broker) cannot be sent again: it is skipped, with a WARN. With
    /// [`origin_secret`](Self::origin_secret) set, a dead letter whose
    /// signature does not hold is sent again as its own record (under a
    /// key of its place in the dead-letter topic), never under the key it
    /// claims.
    ///
    /// # Errors
    ///
    /// [`Error::Kafka`] when the consumer or the producer cannot be made
    /// or a commit fails; [`Error::NoRetryTopic`] for a runner without a
    /// retry topic.
    pub async fn redrive(&self, per_second: u32, idle: Duration) -> Result<u64, Error> {
        let Some(first) = self.topics.level(0).map(str::to_owned) else {
            return Err(Error::NoRetryTopic);
        };
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", format!("{}-redrive", self.group))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "50");
        for (k, v) in &self.settings {
            if k != "group.id" {
                config.set(k, v);
            }
        }
        let consumer: StreamConsumer = config.create()?;
        consumer.subscribe(&[self.topics.dlt()])?;
        let mut producer = ClientConfig::new();
        producer
            .set("bootstrap.servers", &self.brokers)
            .set("acks", "all")
            .set("linger.ms", "0");
        for (k, v) in &self.producer_settings {
            producer.set(k, v);
        }
        let producer: FutureProducer = producer.create()?;
        let worker = Worker {
            cfg: self,
            producer: &producer,
        };
        let every = Duration::from_secs(1) / per_second.max(1);
        let mut next = tokio::time::Instant::now();
        let mut sent = 0;
        loop {
            let m = match tokio::time::timeout(idle, consumer.recv()).await {
                Err(_) => return Ok(sent),
                Ok(Err(e)) => {
                    tracing::debug!(target: "retries_kafka", error = %e, "redrive: the consumer failed; reading on");
                    continue;
                }
                Ok(Ok(m)) => m.detach(),
            };
            let dropped = m.headers().is_some_and(|h| {
                h.iter()
                    .any(|h| h.key == "retries-payload" && h.value == Some(b"dropped"))
            });
            if dropped {
                tracing::warn!(target: "retries_kafka", partition = m.partition(), offset = m.offset(), "redrive: a dead letter without its payload cannot be sent again; skipped");
            } else {
                tokio::time::sleep_until(next).await;
                next = tokio::time::Instant::now() + every;
                // Its claims read as a retry copy's (level 1), under the
                // signature when there is a secret.
                let mut record = self.record_of(&m, 1);
                record.level = 0;
                record.first_seen_ms = now_ms();
                record.cut = true;
                if let Err(e) = worker
                    .write(
                        &m,
                        &record,
                        &first,
                        Some(Duration::ZERO),
                        None,
                        None,
                        Whole::Record,
                        Some(("retries-cut", "redrive")),
                    )
                    .await
                {
                    tracing::warn!(target: "retries_kafka", partition = m.partition(), offset = m.offset(), error = %e, "redrive: a dead letter could not be sent again; skipped");
                } else {
                    sent += 1;
                }
            }
            let mut done = TopicPartitionList::new();
            done.add_partition_offset(m.topic(), m.partition(), Offset::Offset(m.offset() + 1))?;
            consumer.commit(&done, CommitMode::Sync)?;
        }
    }
}
