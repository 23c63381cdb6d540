//! The runner's topics: the retry levels and the dead-letter topic of one
//! main topic ([`Topics`]), and their provisioning (created when asked,
//! waited for, reported missing).

use crate::consumer::{Outage, Rebalances, cannot_heal, sleep_until};
use crate::{Error, RetryTopics};
use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// The topics of one main topic: its retry levels (each with its delay) and
/// its dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    main: String,
    pub(crate) levels: Vec<(String, Duration)>,
    dlt: String,
}

impl Topics {
    /// `main`, `main-retry-0` … `main-retry-{n-1}` with the `delays` in
    /// order, and `main-dlt`.
    #[must_use]
    pub fn new(main: &str, delays: &[Duration]) -> Self {
        Self {
            main: main.to_owned(),
            levels: delays
                .iter()
                .enumerate()
                .map(|(i, d)| (format!("{main}-retry-{i}"), *d))
                .collect(),
            dlt: format!("{main}-dlt"),
        }
    }

    /// The main topic.
    #[must_use]
    pub fn main(&self) -> &str {
        &self.main
    }

    /// The retry topic of `level` (0-based), if there is one.
    #[must_use]
    pub fn level(&self, level: usize) -> Option<&str> {
        self.levels.get(level).map(|(t, _)| t.as_str())
    }

    /// The dead-letter topic.
    #[must_use]
    pub fn dlt(&self) -> &str {
        &self.dlt
    }

    /// Every topic, main first, the dead-letter topic last.
    #[must_use]
    pub fn all(&self) -> Vec<&str> {
        let mut all = vec![self.main.as_str()];
        all.extend(self.levels.iter().map(|(t, _)| t.as_str()));
        all.push(&self.dlt);
        all
    }

    /// The delay of the retry topic of `level` (as [`level_of`](Self::level_of)
    /// counts: 1 for `-retry-0`); `None` for the main topic.
    pub(crate) fn delay_of(&self, level: usize) -> Option<Duration> {
        self.levels.get(level.checked_sub(1)?).map(|(_, d)| *d)
    }

    /// The level of `topic`: `Some(0)` for the main topic, `Some(n + 1)`
    /// for `-retry-n`.
    pub(crate) fn level_of(&self, topic: &str) -> Option<usize> {
        if topic == self.main {
            return Some(0);
        }
        self.levels
            .iter()
            .position(|(t, _)| t == topic)
            .map(|i| i + 1)
    }
}

impl RetryTopics {
    /// The runner's topics that the broker does not know, or an error if
    /// the broker could not be asked.
    pub(crate) fn missing(
        &self,
        consumer: &StreamConsumer<Rebalances>,
    ) -> Result<Vec<String>, KafkaError> {
        let metadata = consumer.fetch_metadata(None, Duration::from_secs(5))?;
        let known: HashMap<&str, usize> = metadata
            .topics()
            .iter()
            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
            .map(|t| (t.name(), t.partitions().len()))
            .collect();
        Ok(self
            .topics
            .all()
            .into_iter()
            .filter(|t| !known.contains_key(t))
            .map(str::to_owned)
            .collect())
    }

    /// Before the first record: every topic the runner reads or writes
    /// exists, or is created ([`create_topics`](Self::create_topics)), or
    /// `run` ends with [`Error::MissingTopics`] once
    /// [`topic_wait`](Self::topic_wait) has passed. A broker that cannot be
    /// reached is waited for, however long it takes.
    pub(crate) async fn provision(
        &self,
        consumer: &StreamConsumer<Rebalances>,
    ) -> Result<(), Error> {
        let mut outage = Outage::new(self.outage_backoff, "the consumer");
        let mut missing_since: Option<Instant> = None;
        loop {
            let missing = match self.missing(consumer) {
                Ok(missing) => {
                    outage.over();
                    missing
                }
                Err(e) if cannot_heal(&e) => return Err(Error::Fatal(e)),
                Err(e) => {
                    outage.begin(&e);
                    sleep_until(outage.until.take()).await;
                    continue;
                }
            };
            if missing.is_empty() {
                return Ok(());
            }
            let main_known = !missing.iter().any(|t| t == self.topics.main());
            if let (Some(replication), true) = (self.create_topics, main_known) {
                self.create(consumer, &missing, replication).await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let since = *missing_since.get_or_insert_with(|| {
                tracing::info!(target: "retries_kafka", missing = ?missing, wait_ms = crate::millis(self.topic_wait), "topics missing: waiting for them to appear");
                Instant::now()
            });
            if since.elapsed() >= self.topic_wait {
                return Err(Error::MissingTopics { topics: missing });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Create `missing` with as many partitions as the main topic.
    async fn create(
        &self,
        consumer: &StreamConsumer<Rebalances>,
        missing: &[String],
        replication: i32,
    ) -> Result<(), Error> {
        let metadata = consumer.fetch_metadata(Some(self.topics.main()), Duration::from_secs(5))?;
        let partitions = metadata.topics().first().map_or(1, |t| {
            i32::try_from(t.partitions().len())
                .unwrap_or(i32::MAX)
                .max(1)
        });
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        for (k, v) in &self.settings {
            config.set(k, v);
        }
        let admin: AdminClient<DefaultClientContext> = config.create()?;
        let new: Vec<_> = missing
            .iter()
            .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(replication)))
            .collect();
        for result in admin.create_topics(&new, &AdminOptions::new()).await? {
            match result {
                Ok(topic) => {
                    tracing::info!(target: "retries_kafka", topic, partitions, "topic created");
                }
                // Another runner of the group created it first.
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => {
                    return Err(Error::CreateTopic {
                        topic,
                        error: KafkaError::AdminOp(code),
                    });
                }
            }
        }
        Ok(())
    }
}
