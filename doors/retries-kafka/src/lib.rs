//! Durable retries on Kafka, driven by the `retries` engine: a record whose
//! handler fails transiently goes to a retry topic with a due time, a
//! consumer pauses that topic's partition until the record is due, and a
//! record that cannot succeed goes to a dead-letter topic, with the reason.
//!
//! # Topics and headers
//!
//! For a main topic `orders` and delays `[d0, d1, …]` ([`Topics::new`]):
//! `orders-retry-0` (records due `d0` after their failure), `orders-retry-1`
//! (`d1`), …, one topic per retry level, and `orders-dlt`. A record moves
//! one level up per failure. Every republished record keeps its key and
//! payload and carries these headers:
//!
//! | header | value |
//! |---|---|
//! | `retries-attempt` | the level it is in (`1` in `-retry-0`, `2` in `-retry-1`, …) |
//! | `retries-due-ms` | when it is due, Unix milliseconds |
//! | `retries-first-seen-ms` | when the main topic's consumer first saw it |
//! | `retries-original-topic`, `-partition`, `-offset` | where it was first |
//! | `retries-key` | its idempotency key (32 hex digits): the same on every copy, derived from topic, partition and offset |
//! | `retries-error`, `retries-verdict` | the last error's text and its verdict (`not_executed`, `unknown`, `permanent`) |
//! | `retries-payload` | `dropped` on a dead letter written without its payload (below) |
//! | `retries-reason` | on the dead-letter topic: why ([`Reason::as_str`](retries::Reason::as_str): `permanent`, `exhausted`, `deadline_exceeded`, `unknown_outcome`, …) |
//!
//! # Which headers are trusted
//!
//! On the **main topic** every `retries-*` header is ignored: its producers
//! are not the runner, and a header there could give a record another
//! record's key (a deduplicating handler would then drop it), dead-letter it
//! unrun (`retries-first-seen-ms: 0` under a record deadline) or switch its
//! deadline off. A main-topic record is first seen when the runner reads it,
//! due at once, its key that of its own coordinates.
//!
//! On a **retry topic** the headers are the runner's, but anyone with write
//! access may add some: the key is never read (it is derived again from the
//! original coordinates the record claims, so no copy can take another
//! record's key); a value that does not parse is taken as missing; a
//! first-seen time in the future is taken as now; a due time further off
//! than the level's delay is taken as due (below).
//!
//! # What happens to a record
//!
//! 1. A record from a retry topic that is not due yet: its partition is
//!    paused and rewound to it, and resumed when it is due (the consumer
//!    goes on with every other partition; nothing polls in a loop). A due
//!    time further off than the level's delay (a clock skewed by more than
//!    that, or a header someone else wrote) is taken as due now, so it
//!    cannot stall the partition; a header that does not parse (a negative
//!    time, a partition past `i32`) is taken as missing.
//! 2. Past the whole-record deadline ([`RetryTopics::record_deadline`],
//!    measured from `retries-first-seen-ms`): dead-lettered,
//!    `deadline_exceeded`. The deadline also bounds the in-process call
//!    below: its deadline is the policy's or the time the record has left,
//!    whichever is earlier, so a slow handler is cut off at the record
//!    deadline (and the record dead-lettered, never committed as done).
//! 3. Otherwise the handler runs under a short in-process retry (the
//!    engine, with [`RetryTopics::policy`], the breaker and the budget). A
//!    handler (or `reconcile`) that panics is caught: the panic is a failed
//!    attempt whose outcome is unknown (it may have done part of its work),
//!    its message the error's text (`the handler panicked: …`), and the
//!    consumer goes on:
//!    * success: the offset is committed;
//!    * `Permanent`: dead-lettered;
//!    * an unknown outcome of a non-idempotent handler
//!      ([`RetryTopics::not_idempotent`]): the `reconcile` function, if given
//!      ([`RetryTopics::run_reconciled`]), decides (done: committed; not
//!      done: retried); without one, or if it fails, dead-lettered with
//!      `unknown_outcome`, never republished blindly;
//!    * transient failures that outlast the in-process attempts, deadline or
//!      budget: republished to the next retry level, or dead-lettered with
//!      `exhausted` after the last;
//!    * the breaker open (`circuit_open`): nothing is republished. The
//!      record's partition **and every partition of the main topic** are
//!      paused, rewound, and retried every [`RetryTopics::probe_every`]; the
//!      breaker's half-open probe decides when consumption resumes. An
//!      outage therefore stops the intake instead of pushing every record
//!      through the retry topics into the dead-letter topic.
//! 4. A record that cannot be written where it goes because it is too large
//!    with the runner's headers (`MessageSizeTooLarge`, from the producer
//!    or the broker) is never retried in a loop: a republish becomes a dead
//!    letter (`exhausted`, its error `too large to republish (…); last
//!    error: …`), and a dead letter too large to write whole is written
//!    without its payload (key, headers, original coordinates and reason
//!    kept, `retries-payload: dropped`).
//! 5. The original's offset is committed only after the republish (or the
//!    dead-letter write) is acknowledged (`acks=all`). A process killed in
//!    between re-reads the record and republishes it again: at least once,
//!    with the same `retries-key`, so the handler can deduplicate.
//!
//! # Concurrency and commits
//!
//! Up to [`RetryTopics::concurrency`] records are in flight at once (16 by
//! default), in one task (the handler needs no `Send`): records of
//! different partitions, of the main topic and of each retry level, run
//! concurrently; the records of one partition run one at a time, in order
//! (those fetched meanwhile wait in a queue of at most 1,024, then the
//! partition is paused until it drains). A record's offset is committed
//! once it is finished (handled, or its republish or dead letter
//! acknowledged), asynchronously, together with every other offset finished
//! since the last commit, one commit in flight at a time (so under load a
//! batch is whatever finished during one commit's round trip, and an idle
//! consumer commits at once); since each partition runs in order, a
//! committed offset is never past an unfinished record. A process that dies
//! re-reads what finished after its last landed commit (at least once, the
//! same `retries-key`). `run` ending commits what is finished synchronously
//! and drops what is in flight, uncommitted.
//!
//! **Rebalances.** Before partitions are revoked the offsets finished on
//! them are committed synchronously, so the next owner starts where this
//! one stopped; their pauses, wake-ups and queues are forgotten. A record of
//! a revoked partition still in flight finishes but is not committed: the
//! next owner handles it again (at least once, with the same
//! `retries-key`). Pauses and rewinds belong to the current assignment.
//!
//! The producer sends one record per batch (`batch.num.messages=1`, see
//! [`broker`] for why).
//!
//! # When the broker fails
//!
//! `run` ends only for what waiting cannot heal ([`Error`]): a setting
//! librdkafka rejects, credentials or authorisation the broker refuses, a
//! topic still missing after [`RetryTopics::topic_wait`]. Everything else is
//! an outage, logged once when it starts (WARN) and when it ends (INFO),
//! and waited out with [`RetryTopics::outage_backoff`] (the engine's
//! [`Backoff`]):
//!
//! * an error from the consumer (all brokers down, a broker restarting, a
//!   coordinator moving): the next fetch waits the next pause;
//! * a republish or dead-letter write not acknowledged: sent again after the
//!   next pause, as long as it takes, the original's offset uncommitted
//!   (the record is held, not skipped: nothing behind it in its partition
//!   overtakes it). A write that can never succeed (too large) is not
//!   retried (4. above).
//!
//! # Topics
//!
//! Before the first record, `run` checks that the main topic, every retry
//! topic and the dead-letter topic exist. With
//! [`RetryTopics::create_topics`] the missing retry and dead-letter topics
//! are created with the main topic's number of partitions; without it, or
//! when the main topic itself is missing, `run` waits
//! [`RetryTopics::topic_wait`] (10 s by default) for them to appear, then
//! ends with [`Error::MissingTopics`] naming them. A broker that cannot be
//! reached at start is waited for, however long.
//!
//! # Observability
//!
//! Metrics, label `topic`: `retry.kafka.processed` (handled successfully),
//! `retry.kafka.retried` (+ `level`), `retry.kafka.dead_lettered` (+
//! `reason`), `retry.kafka.paused` (histogram, seconds a partition stayed
//! paused). Tracing, target `retries_kafka`: DEBUG per record, WARN for a
//! dead letter and when the main topic is paused by the breaker, INFO when
//! it resumes.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use retries::{
    Attempt, Backoff, CircuitBreaker, Classify, Failure, IdempotencyKey, Policy, Reason,
    TokenBucket,
};

pub mod broker;

/// The topics of one main topic: its retry levels (each with its delay) and
/// its dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    main: String,
    levels: Vec<(String, Duration)>,
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
    fn delay_of(&self, level: usize) -> Option<Duration> {
        self.levels.get(level.checked_sub(1)?).map(|(_, d)| *d)
    }

    /// The level of `topic`: `Some(0)` for the main topic, `Some(n + 1)`
    /// for `-retry-n`.
    fn level_of(&self, topic: &str) -> Option<usize> {
        if topic == self.main {
            return Some(0);
        }
        self.levels
            .iter()
            .position(|(t, _)| t == topic)
            .map(|i| i + 1)
    }
}

/// A record as the handler sees it: where it was first, its key and payload,
/// how many times it failed before, and its idempotency key (the same on
/// every copy).
#[derive(Debug, Clone)]
pub struct Record {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    level: u32,
    idempotency_key: IdempotencyKey,
    first_seen_ms: u64,
    due_ms: Option<u64>,
    error: Option<String>,
}

impl Record {
    /// The main topic it was produced to.
    #[must_use]
    pub fn topic(&self) -> &str {
        &self.topic
    }
    /// Its partition in the main topic.
    #[must_use]
    pub fn partition(&self) -> i32 {
        self.partition
    }
    /// Its offset in the main topic.
    #[must_use]
    pub fn offset(&self) -> i64 {
        self.offset
    }
    /// Its key.
    #[must_use]
    pub fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }
    /// Its payload.
    #[must_use]
    pub fn payload(&self) -> Option<&[u8]> {
        self.payload.as_deref()
    }
    /// 0 from the main topic, `n + 1` from `-retry-n`.
    #[must_use]
    pub fn level(&self) -> u32 {
        self.level
    }
    /// Its idempotency key: stable across every copy of the record, so a
    /// handler can deduplicate its effects.
    #[must_use]
    pub fn idempotency_key(&self) -> IdempotencyKey {
        self.idempotency_key
    }
    /// When it was due (Unix milliseconds), for a record from a retry topic.
    #[must_use]
    pub fn due_ms(&self) -> Option<u64> {
        self.due_ms
    }
    /// The error of its last failure, for a record from a retry topic.
    #[must_use]
    pub fn last_error(&self) -> Option<&str> {
        self.error.as_deref()
    }
}

/// Why a record was dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The reason, as in [`Reason`].
    pub reason: Reason,
    /// The last error's text, if any.
    pub error: Option<String>,
}

/// Counts of what the runner did (also reported as metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Records handled successfully, by level (0: first time; `n`: after
    /// `n` republishes).
    pub done: Vec<u64>,
    /// Records republished, by target level (0 = `-retry-0`).
    pub retried: Vec<u64>,
    /// Records dead-lettered.
    pub dead_lettered: u64,
    /// Records skipped as already handled (offset before the committed one).
    pub duplicates_skipped: u64,
    /// Time the main topic spent paused by an open breaker.
    pub main_paused: Duration,
    /// Times the main topic was paused by an open breaker.
    pub main_pauses: u64,
}

/// Why [`RetryTopics::run`] ended without being asked to: only errors that
/// waiting cannot heal. A broker that is down or restarting, a coordinator
/// that moves, a write that is not acknowledged are waited out (see the
/// [crate docs](crate#when-the-broker-fails)), never returned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A client could not be created: a setting librdkafka rejects, a
    /// subscription it refuses.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The broker refuses the consumer for good: its credentials or its
    /// authorisation (`SASL authentication failed`, `topic authorization
    /// failed`, …).
    #[error("the consumer cannot go on: {0}")]
    Fatal(KafkaError),
    /// Topics the runner reads or writes do not exist after
    /// [`RetryTopics::topic_wait`], and creating them is off
    /// ([`RetryTopics::create_topics`]) or the main topic is one of them.
    #[error("missing topics (create them, or let the runner: RetryTopics::create_topics): {}", topics.join(", "))]
    MissingTopics {
        /// The missing topics.
        topics: Vec<String>,
    },
    /// Creating a missing topic failed.
    #[error("could not create topic {topic}: {error}")]
    CreateTopic {
        /// The topic.
        topic: String,
        /// The broker's answer.
        #[source]
        error: KafkaError,
    },
}

type RepublishHook = Box<dyn Fn(&Record, &str) + Send + Sync>;
type DeadLetterHook = Box<dyn Fn(&Record, &DeadLetter) + Send + Sync>;
/// The type of "no `reconcile`".
type NoLookup<E> = fn(&Record) -> std::future::Ready<Result<bool, E>>;

/// The consumer runner; see the [crate docs](crate).
pub struct RetryTopics {
    brokers: String,
    group: String,
    topics: Topics,
    policy: Policy,
    record_deadline: Option<Duration>,
    idempotent: bool,
    breaker: Option<Arc<CircuitBreaker>>,
    budget: Arc<TokenBucket>,
    probe_every: Duration,
    stats: Arc<Mutex<Stats>>,
    settings: Vec<(String, String)>,
    producer_settings: Vec<(String, String)>,
    concurrency: usize,
    create_topics: Option<i32>,
    topic_wait: Duration,
    outage_backoff: Backoff,
    after_republish: Option<RepublishHook>,
    on_dead_letter: Option<DeadLetterHook>,
}

impl std::fmt::Debug for RetryTopics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryTopics")
            .field("brokers", &self.brokers)
            .field("group", &self.group)
            .field("topics", &self.topics)
            .field("policy", &self.policy)
            .field("record_deadline", &self.record_deadline)
            .field("idempotent", &self.idempotent)
            .finish_non_exhaustive()
    }
}

impl RetryTopics {
    /// A runner for `topics` in consumer group `group` (its retry topics are
    /// read by the same group). Defaults: in-process policy of 3 attempts
    /// within 1 s, idempotent handler, no whole-record deadline, a token
    /// bucket of its own, no breaker, probes every second, 16 records in
    /// flight, topics not created (waited for 10 s), broker outages waited
    /// out with pauses from 100 ms doubling to 5 s.
    #[must_use]
    pub fn new(brokers: &str, group: &str, topics: Topics) -> Self {
        Self {
            brokers: brokers.to_owned(),
            group: group.to_owned(),
            topics,
            policy: Policy::new(Duration::from_secs(1)).with_max_attempts(3),
            record_deadline: None,
            idempotent: true,
            breaker: None,
            budget: Arc::new(TokenBucket::DEFAULT),
            probe_every: Duration::from_secs(1),
            stats: Arc::default(),
            settings: Vec::new(),
            producer_settings: Vec::new(),
            concurrency: 16,
            create_topics: None,
            topic_wait: Duration::from_secs(10),
            outage_backoff: Backoff::exponential(
                Duration::from_millis(100),
                2.0,
                Duration::from_secs(5),
            ),
            after_republish: None,
            on_dead_letter: None,
        }
    }

    /// A librdkafka setting for the consumer (`session.timeout.ms`, …);
    /// `enable.auto.commit` is always `false`, offsets are committed by hand.
    /// The runner sets `auto.offset.reset=earliest` and
    /// `fetch.wait.max.ms=50` (a partition resumed after a pause is fetched
    /// again within 50 ms); a setting given here replaces them.
    #[must_use]
    pub fn consumer_setting(mut self, key: &str, value: &str) -> Self {
        self.settings.push((key.to_owned(), value.to_owned()));
        self
    }

    /// A librdkafka setting for the producer that writes retry copies and
    /// dead letters (`message.max.bytes`, `compression.type`, security
    /// settings, …). The runner sets `acks=all`, `batch.num.messages=1` and
    /// `linger.ms=0` (see [`broker`] for why); a setting given here replaces
    /// them.
    #[must_use]
    pub fn producer_setting(mut self, key: &str, value: &str) -> Self {
        self.producer_settings
            .push((key.to_owned(), value.to_owned()));
        self
    }

    /// At most `n` records in flight at once (at least 1), each partition's
    /// one at a time and in order: records of different partitions and
    /// retry levels run concurrently (see the
    /// [crate docs](crate#concurrency-and-commits)).
    #[must_use]
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Create the retry and dead-letter topics when they are missing, with
    /// as many partitions as the main topic and `replication_factor`
    /// replicas (`-1`: the broker's default, Kafka 2.4 and later). The main
    /// topic is never created: without it `run` ends with
    /// [`Error::MissingTopics`].
    #[must_use]
    pub fn create_topics(mut self, replication_factor: i32) -> Self {
        self.create_topics = Some(replication_factor);
        self
    }

    /// How long `run` waits for missing topics (another process creating
    /// them, a broker catching up) before it ends with
    /// [`Error::MissingTopics`]; also how long an "unknown topic" from the
    /// consumer is waited out during the run.
    #[must_use]
    pub fn topic_wait(mut self, wait: Duration) -> Self {
        self.topic_wait = wait;
        self
    }

    /// The pauses between tries while the broker fails (the consumer's
    /// errors, writes not acknowledged): pause `n` for the `n`-th error in a
    /// row, as the engine computes them.
    #[must_use]
    pub fn outage_backoff(mut self, backoff: Backoff) -> Self {
        self.outage_backoff = backoff;
        self
    }

    /// The in-process retry before a record is republished.
    #[must_use]
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Dead-letter a record this long after it was first seen.
    #[must_use]
    pub fn record_deadline(mut self, limit: Duration) -> Self {
        self.record_deadline = Some(limit);
        self
    }

    /// The handler is not idempotent: an unknown outcome is not republished
    /// blindly (see the crate docs).
    #[must_use]
    pub fn not_idempotent(mut self) -> Self {
        self.idempotent = false;
        self
    }

    /// A breaker in front of the handler (shared, so a caller can see it).
    #[must_use]
    pub fn breaker(mut self, breaker: Arc<CircuitBreaker>) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// The budget of the in-process retries.
    #[must_use]
    pub fn budget(mut self, budget: Arc<TokenBucket>) -> Self {
        self.budget = budget;
        self
    }

    /// How often a partition paused by an open breaker tries again.
    #[must_use]
    pub fn probe_every(mut self, every: Duration) -> Self {
        self.probe_every = every;
        self
    }

    /// Called after a republish or dead-letter write is acknowledged and
    /// before the original's offset is committed, with the topic written to.
    #[must_use]
    pub fn after_republish(mut self, hook: impl Fn(&Record, &str) + Send + Sync + 'static) -> Self {
        self.after_republish = Some(Box::new(hook));
        self
    }

    /// The dead-letter hook: called for each record written to the
    /// dead-letter topic, with the reason, once the write is acknowledged.
    #[must_use]
    pub fn on_dead_letter(
        mut self,
        hook: impl Fn(&Record, &DeadLetter) + Send + Sync + 'static,
    ) -> Self {
        self.on_dead_letter = Some(Box::new(hook));
        self
    }

    /// What the runner has done so far, readable while it runs.
    #[must_use]
    pub fn stats(&self) -> Arc<Mutex<Stats>> {
        Arc::clone(&self.stats)
    }

    /// Consume until `shutdown` completes, handling each record with
    /// `handler(&record, &attempt)`.
    pub async fn run<H, E>(
        self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Stats, Error>
    where
        H: AsyncFn(&Record, &Attempt) -> Result<(), E>,
        E: Classify + std::fmt::Display,
    {
        let none: Option<&NoLookup<E>> = None;
        self.drive(handler, none, shutdown).await
    }

    /// [`run`](Self::run) with a `reconcile` look-up for a non-idempotent
    /// handler: after an unknown outcome, `reconcile(&record)` says whether
    /// the work was done (`Ok(true)`: committed; `Ok(false)`: retried).
    pub async fn run_reconciled<H, R, E>(
        self,
        handler: H,
        reconcile: R,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Stats, Error>
    where
        H: AsyncFn(&Record, &Attempt) -> Result<(), E>,
        R: AsyncFn(&Record) -> Result<bool, E>,
        E: Classify + std::fmt::Display,
    {
        self.drive(handler, Some(&reconcile), shutdown).await
    }

    async fn drive<H, R, E>(
        self,
        handler: H,
        reconcile: Option<&R>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Stats, Error>
    where
        H: AsyncFn(&Record, &Attempt) -> Result<(), E>,
        R: AsyncFn(&Record) -> Result<bool, E>,
        E: Classify + std::fmt::Display,
    {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", &self.group)
            .set("auto.offset.reset", "earliest")
            // A resumed partition is fetched again at once, not after the
            // broker's long-poll of 500 ms (the default).
            .set("fetch.wait.max.ms", "50");
        for (k, v) in &self.settings {
            config.set(k, v);
        }
        let context = Rebalances {
            name: config.get("client.id").unwrap_or("rdkafka").to_owned(),
            ..Rebalances::default()
        };
        let consumer: StreamConsumer<Rebalances> = config
            .set("enable.auto.commit", "false")
            .create_with_context(context.clone())?;
        let mut producer = ClientConfig::new();
        producer
            .set("bootstrap.servers", &self.brokers)
            .set("acks", "all")
            .set("batch.num.messages", "1")
            .set("linger.ms", "0");
        for (k, v) in &self.producer_settings {
            producer.set(k, v);
        }
        let producer: FutureProducer = producer.create()?;
        let mut shutdown = std::pin::pin!(shutdown);
        tokio::select! {
            biased;
            () = &mut shutdown => return Ok(self.stats.lock().expect("stats").clone()),
            provisioned = self.provision(&consumer) => provisioned?,
        }
        let topics: Vec<&str> = self.topics.all()[..=self.topics.levels.len()].to_vec();
        consumer.subscribe(&topics)?;
        let worker = Worker {
            cfg: &self,
            producer: &producer,
        };
        let mut run = Run {
            cfg: &self,
            consumer: &consumer,
            context: &context,
            parts: HashMap::new(),
            wakes: BTreeSet::new(),
            main_paused_at: None,
            epochs: 0,
            commit_again: None,
            carried: HashMap::new(),
        };
        let mut in_flight = FuturesUnordered::new();
        let mut outage = Outage::new(self.outage_backoff, "the consumer");
        loop {
            let next_wake = run.wakes.first().map(|(at, _, _)| *at);
            let room = in_flight.len() < self.concurrency;
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(finished) = in_flight.next(), if !in_flight.is_empty() => {
                    if let Some(job) = run.finish(&finished) {
                        in_flight.push(worker.handle(job, &handler, reconcile));
                    }
                }
                () = sleep_until(next_wake) => run.wake(),
                () = sleep_until(run.commit_again) => run.commit_again = None,
                () = sleep_until(outage.until) => outage.until = None,
                m = consumer.recv(), if room && outage.until.is_none() => match m {
                    Ok(m) => {
                        outage.over();
                        // A rebalance served by this `recv` comes first: the
                        // record may belong to the new assignment.
                        run.forget_revoked();
                        if let Some(job) = run.accept(m.detach()) {
                            in_flight.push(worker.handle(job, &handler, reconcile));
                        }
                    }
                    Err(e) => self.on_consumer_error(&consumer, e, &mut outage)?,
                },
            }
            run.forget_revoked();
            run.commit_finished(CommitMode::Async);
        }
        // What is still in flight is dropped unfinished: its records are
        // not committed and are read again by the next owner.
        drop(in_flight);
        run.forget_revoked();
        run.commit_finished(CommitMode::Sync);
        if let Some(at) = run.main_paused_at.take() {
            self.stats.lock().expect("stats").main_paused += at.elapsed();
        }
        let stats = self.stats.lock().expect("stats").clone();
        Ok(stats)
    }

    /// An error from the consumer: one that cannot heal ends `run`; any
    /// other starts (or continues) an outage, waited out with
    /// [`outage_backoff`](Self::outage_backoff) and logged once. An unknown
    /// topic is waited out for [`topic_wait`](Self::topic_wait), then ends
    /// `run` if one of the runner's topics is really missing.
    fn on_consumer_error(
        &self,
        consumer: &StreamConsumer<Rebalances>,
        e: KafkaError,
        outage: &mut Outage,
    ) -> Result<(), Error> {
        if cannot_heal(&e) {
            tracing::error!(target: "retries_kafka", error = %e, "the consumer cannot go on");
            return Err(Error::Fatal(e));
        }
        let unknown_topic = unknown_topic(&e);
        outage.begin(&e);
        if unknown_topic && outage.lasted() >= self.topic_wait {
            let missing = self.missing(consumer)?;
            if !missing.is_empty() {
                return Err(Error::MissingTopics { topics: missing });
            }
        }
        Ok(())
    }

    /// The runner's topics that the broker does not know, or an error if
    /// the broker could not be asked.
    fn missing(&self, consumer: &StreamConsumer<Rebalances>) -> Result<Vec<String>, KafkaError> {
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
    async fn provision(&self, consumer: &StreamConsumer<Rebalances>) -> Result<(), Error> {
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
            let since = *missing_since.get_or_insert_with(Instant::now);
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

/// One attempt of the handler: its own error, or a panic (caught).
enum Attempted<E> {
    Failed(E),
    Panicked(String),
}

impl<E: Classify> Classify for Attempted<E> {
    fn classify(&self) -> retries::Verdict {
        match self {
            Self::Failed(e) => e.classify(),
            // It may have done part of its work before it panicked.
            Self::Panicked(_) => retries::Verdict::unknown(),
        }
    }
}

impl<E: std::fmt::Display> std::fmt::Display for Attempted<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Failed(e) => e.fmt(f),
            Self::Panicked(message) => write!(f, "the handler panicked: {message}"),
        }
    }
}

/// `fut`, with a panic while it is polled caught as [`Attempted::Panicked`].
async fn caught<T, E>(fut: impl Future<Output = Result<T, E>>) -> Result<T, Attempted<E>> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(std::task::Poll::Ready(r)) => std::task::Poll::Ready(r.map_err(Attempted::Failed)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".to_owned());
                std::task::Poll::Ready(Err(Attempted::Panicked(message)))
            }
        }
    })
    .await
}

/// The write can never succeed as it is: the record (with the runner's
/// headers) is over a size limit, the producer's or the broker's.
fn too_large(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        e.rdkafka_error_code(),
        Some(Code::MessageSizeTooLarge | Code::InvalidMessageSize)
    )
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// The consumer cannot go on whatever happens next: credentials or
/// authorisation (a configuration error; it does not heal by waiting).
fn cannot_heal(e: &KafkaError) -> bool {
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

fn unknown_topic(e: &KafkaError) -> bool {
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
struct Outage {
    backoff: Backoff,
    /// What fails: "the consumer", "a write".
    what: &'static str,
    /// Errors in a row.
    errors: u32,
    since: Option<Instant>,
    prev: Duration,
    /// Not before this instant, the next try.
    until: Option<Instant>,
}

impl Outage {
    fn new(backoff: Backoff, what: &'static str) -> Self {
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
    fn begin(&mut self, e: &KafkaError) {
        self.errors = self.errors.saturating_add(1);
        if self.since.is_none() {
            self.since = Some(Instant::now());
            tracing::warn!(target: "retries_kafka", what = self.what, error = %e, "broker error: waiting it out");
        } else {
            tracing::debug!(target: "retries_kafka", what = self.what, error = %e, errors = self.errors, "broker error");
        }
        self.prev = self.backoff.delay(self.errors, self.prev);
        self.until = Some(later(self.prev));
    }

    /// How long the episode has lasted.
    fn lasted(&self) -> Duration {
        self.since.map_or(Duration::ZERO, |s| s.elapsed())
    }

    /// A try succeeded: the episode, if any, is over.
    fn over(&mut self) {
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
struct Rebalances {
    /// Next offsets to commit, by partition: each is past finished records
    /// only.
    finished: Arc<Mutex<HashMap<(String, i32), i64>>>,
    /// Partitions revoked since the run loop last looked.
    revoked: Arc<Mutex<Vec<(String, i32)>>>,
    /// The consumer's `client.id`, for the logs.
    name: String,
    /// Since when an asynchronous commit is in flight (its callback clears
    /// it): the offsets finished meanwhile wait for the next one.
    committing: Arc<Mutex<Option<Instant>>>,
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
        tracing::debug!(target: "retries_kafka", client = self.name, partitions = gone.len(), "partitions revoked");
        lock(&self.revoked).extend(gone);
    }

    fn commit_callback(&self, result: rdkafka::error::KafkaResult<()>, _: &TopicPartitionList) {
        if let Err(e) = result {
            // The next commit of each partition covers its offsets; until
            // then a crash re-reads those records (at least once).
            tracing::debug!(target: "retries_kafka", client = self.name, error = %e, "commit failed");
        }
        *lock(&self.committing) = None;
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A partition's state in this assignment.
#[derive(Debug)]
struct Part {
    /// The offset the partition is expected at next: every record before it
    /// is finished, in flight or queued. After a rewind: the record to read
    /// again.
    next: Option<i64>,
    /// Paused since (and until the wake-up).
    paused_since: Option<Instant>,
    /// The offset of this partition's record in flight, if any.
    running: Option<i64>,
    /// Records fetched while one was in flight, in order.
    queue: VecDeque<OwnedMessage>,
    /// Paused because the queue is full: resumed once it has drained.
    full: bool,
    /// Which assignment of the partition this is: a record finished for an
    /// earlier one (revoked since) is not committed.
    epoch: u64,
}

/// At most this many records are queued behind a partition's record in
/// flight; then the partition is paused (and rewound to the first record not
/// queued) until its queue has drained.
const QUEUE: usize = 1024;

/// A record to handle, taken from its partition in order.
struct Job {
    at: (String, i32),
    epoch: u64,
    m: OwnedMessage,
    record: Record,
    level: usize,
}

/// A job's end.
struct Finished {
    at: (String, i32),
    epoch: u64,
    offset: i64,
    settled: Settled,
}

/// What became of a record.
enum Settled {
    /// Handled, republished or dead-lettered (and the write acknowledged):
    /// its offset may be committed.
    Done,
    /// The breaker is open: nothing was attempted; the record is read again
    /// after the probe period.
    Hold,
}

/// The state of one `run`: partitions, their pauses and wake-ups. Touched
/// only by the run loop, between jobs.
struct Run<'r> {
    cfg: &'r RetryTopics,
    consumer: &'r StreamConsumer<Rebalances>,
    context: &'r Rebalances,
    parts: HashMap<(String, i32), Part>,
    /// Paused partitions by when they resume.
    wakes: BTreeSet<(Instant, String, i32)>,
    main_paused_at: Option<Instant>,
    /// Assignments seen, to number them.
    epochs: u64,
    /// When to try again a commit held back by the one in flight.
    commit_again: Option<Instant>,
    /// Records in flight when their partition was revoked: offset and the
    /// revoked assignment's epoch.
    carried: HashMap<(String, i32), (i64, u64)>,
}

/// How soon a commit held back by the one in flight is tried again.
const COMMIT_AGAIN: Duration = Duration::from_millis(10);

/// What the jobs share: the settings and the producer.
struct Worker<'r> {
    cfg: &'r RetryTopics,
    producer: &'r FutureProducer,
}

/// Where a pause rewinds its partition to.
#[derive(Clone, Copy)]
enum Rewind {
    /// This offset: the record there is read again.
    To(i64),
    /// The first record not yet handled nor in flight.
    Unhandled,
}

/// What the handler's call came to.
enum Disposition {
    Done,
    Republish(usize),
    DeadLetter(Reason),
    /// The breaker is open: nothing was attempted.
    Hold,
}

/// `d` after now, saturating (a delay of `Duration::MAX` in the settings is
/// "as late as can be", not a panic).
fn later(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_hours(24 * 365 * 30)))
        .unwrap_or(now)
}

/// Whole milliseconds of `d`, saturating at `u64::MAX`.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// FNV-1a, 128 bits: a record's idempotency key from where it was first.
fn key_of(topic: &str, partition: i32, offset: i64) -> IdempotencyKey {
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013B;
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for b in topic
        .bytes()
        .chain(partition.to_be_bytes())
        .chain(offset.to_be_bytes())
    {
        h ^= u128::from(b);
        h = h.wrapping_mul(PRIME);
    }
    IdempotencyKey::from_u128(h)
}

fn header<'m>(m: &'m OwnedMessage, name: &str) -> Option<&'m str> {
    let headers = m.headers()?;
    headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .and_then(|v| std::str::from_utf8(v).ok())
}

impl RetryTopics {
    fn record_of(&self, m: &OwnedMessage, level: usize) -> Record {
        let now = now_ms();
        // The main topic's producers are not the runner: there every
        // `retries-*` header is ignored, and the record is its own origin,
        // first seen now, due now. A retry topic is written by the runner,
        // but anyone may write to it: a value that does not parse into its
        // type (a negative time, a partition past `i32`) is taken as
        // missing, never wrapped around; a first-seen time in the future is
        // taken as now.
        let ours = |name: &str| if level == 0 { None } else { header(m, name) };
        let num = |name: &str| ours(name).and_then(|v| v.parse::<i64>().ok());
        let unix_ms = |name: &str| ours(name).and_then(|v| v.parse::<u64>().ok());
        let topic = ours("retries-original-topic")
            .unwrap_or(self.topics.main())
            .to_owned();
        let partition = num("retries-original-partition")
            .and_then(|p| i32::try_from(p).ok())
            .unwrap_or(m.partition());
        let offset = num("retries-original-offset").unwrap_or(m.offset());
        // The key is a function of the original coordinates, so a copy
        // cannot claim another record's key: it is derived, never read.
        let idempotency_key = key_of(&topic, partition, offset);
        Record {
            topic,
            partition,
            offset,
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().map(<[u8]>::to_vec),
            level: level as u32,
            idempotency_key,
            first_seen_ms: unix_ms("retries-first-seen-ms").map_or(now, |t| t.min(now)),
            due_ms: unix_ms("retries-due-ms"),
            error: ours("retries-error").map(str::to_owned),
        }
    }

    /// The time the record has left under the record deadline, if there is
    /// one (zero once it has passed).
    fn left(&self, record: &Record) -> Option<Duration> {
        let d = self.record_deadline?;
        let end = record.first_seen_ms.saturating_add(millis(d));
        Some(Duration::from_millis(end.saturating_sub(now_ms())))
    }

    fn expired(&self, record: &Record) -> bool {
        self.left(record).is_some_and(|left| left.is_zero())
    }

    /// The policy of the record's in-process call: the runner's, its
    /// deadline cut to the time the record has left; `None` when nothing
    /// valid is left.
    fn policy_for(&self, record: &Record) -> Option<Policy> {
        let policy = self.policy;
        match self.left(record) {
            None => Some(policy),
            Some(left) if left >= policy.deadline() => Some(policy),
            Some(left) if left.is_zero() => None,
            Some(left) => policy.with_deadline(left).try_validated().ok(),
        }
    }
}

impl Worker<'_> {
    /// One record, from its handler's call to the acknowledged write of
    /// where it goes next.
    async fn handle<H, R, E>(&self, job: Job, handler: &H, reconcile: Option<&R>) -> Finished
    where
        H: AsyncFn(&Record, &Attempt) -> Result<(), E>,
        R: AsyncFn(&Record) -> Result<bool, E>,
        E: Classify + std::fmt::Display,
    {
        let Job {
            at,
            epoch,
            m,
            record,
            level,
        } = job;
        let settled = self.settle(&m, &record, level, handler, reconcile).await;
        Finished {
            at,
            epoch,
            offset: m.offset(),
            settled,
        }
    }

    async fn settle<H, R, E>(
        &self,
        m: &OwnedMessage,
        record: &Record,
        level: usize,
        handler: &H,
        reconcile: Option<&R>,
    ) -> Settled
    where
        H: AsyncFn(&Record, &Attempt) -> Result<(), E>,
        R: AsyncFn(&Record) -> Result<bool, E>,
        E: Classify + std::fmt::Display,
    {
        // The record deadline bounds the in-process call too: its deadline
        // is the policy's or the time the record has left, whichever is
        // earlier. A record with too little time left for a valid policy (the
        // policy's reserve and `min_attempt` no longer fit) is past it.
        let (disposition, error) = match self.cfg.policy_for(record) {
            Some(policy) => {
                let (disposition, error) = self.call(record, &policy, handler, reconcile).await;
                if matches!(disposition, Disposition::Republish(_)) && self.cfg.expired(record) {
                    (Disposition::DeadLetter(Reason::DeadlineExceeded), error)
                } else {
                    (disposition, error)
                }
            }
            None => (
                Disposition::DeadLetter(Reason::DeadlineExceeded),
                record.error.clone().map(|e| (e, "unknown")),
            ),
        };
        match disposition {
            Disposition::Hold => return Settled::Hold,
            Disposition::Done => {
                let mut stats = self.cfg.stats.lock().expect("stats");
                if stats.done.len() <= level {
                    stats.done.resize(level + 1, 0);
                }
                stats.done[level] += 1;
                drop(stats);
                metrics::counter!("retry.kafka.processed", "topic" => m.topic().to_owned())
                    .increment(1);
                tracing::debug!(target: "retries_kafka", topic = m.topic(), partition = m.partition(), offset = m.offset(), level, "record handled");
            }
            Disposition::Republish(to) => {
                let topic = self.cfg.topics.level(to).expect("a level").to_owned();
                let delay = self.cfg.topics.levels[to].1;
                if let Err(e) = self
                    .write(m, record, &topic, Some(delay), error.as_ref(), None, true)
                    .await
                {
                    // Too large: it can never be republished. Dead-lettered
                    // (without its payload if that too is too large), never
                    // retried in a loop.
                    let why = format!(
                        "too large to republish ({e}); last error: {}",
                        error.as_ref().map_or("none", |e| e.0.as_str())
                    );
                    let verdict = error.as_ref().map_or("unknown", |e| e.1);
                    self.dead_letter(m, record, Reason::Exhausted, Some((why, verdict)))
                        .await;
                    return Settled::Done;
                }
                let mut stats = self.cfg.stats.lock().expect("stats");
                if stats.retried.len() <= to {
                    stats.retried.resize(to + 1, 0);
                }
                stats.retried[to] += 1;
                drop(stats);
                metrics::counter!("retry.kafka.retried", "topic" => self.cfg.topics.main().to_owned(), "level" => to.to_string()).increment(1);
                tracing::debug!(target: "retries_kafka", topic = m.topic(), offset = m.offset(), to = %topic, "record republished");
            }
            Disposition::DeadLetter(reason) => self.dead_letter(m, record, reason, error).await,
        }
        Settled::Done
    }

    /// Write the record to the dead-letter topic, and tell. A record too
    /// large to write is dead-lettered without its payload (its key,
    /// headers, original coordinates and reason, and
    /// `retries-payload: dropped`).
    async fn dead_letter(
        &self,
        m: &OwnedMessage,
        record: &Record,
        reason: Reason,
        mut error: Option<(String, &'static str)>,
    ) {
        let dlt = self.cfg.topics.dlt().to_owned();
        if let Err(e) = self
            .write(m, record, &dlt, None, error.as_ref(), Some(reason), true)
            .await
        {
            let text = format!(
                "{}; dead-lettered without its payload ({e})",
                error.as_ref().map_or("no error", |e| e.0.as_str())
            );
            error = Some((text, error.as_ref().map_or("unknown", |e| e.1)));
            if let Err(e) = self
                .write(m, record, &dlt, None, error.as_ref(), Some(reason), false)
                .await
            {
                // Even its key and headers are over the limit: nothing of
                // it can be written anywhere. Said loudly, and not retried.
                tracing::error!(target: "retries_kafka", topic = m.topic(), partition = m.partition(), offset = m.offset(), error = %e, "record too large to dead-letter even without its payload");
                return;
            }
        }
        self.cfg.stats.lock().expect("stats").dead_lettered += 1;
        metrics::counter!("retry.kafka.dead_lettered", "topic" => self.cfg.topics.main().to_owned(), "reason" => reason.as_str()).increment(1);
        tracing::warn!(target: "retries_kafka", topic = m.topic(), offset = m.offset(), reason = reason.as_str(), error = error.as_ref().map_or("", |e| e.0.as_str()), "record dead-lettered");
        if let Some(hook) = &self.cfg.on_dead_letter {
            let error = error.map(|e| e.0);
            hook(record, &DeadLetter { reason, error });
        }
    }

    /// The in-process retry, on the engine: its result as a disposition,
    /// with the last error's text. A panic of the handler (or of
    /// `reconcile`) is caught: it is a failed attempt whose outcome is
    /// unknown (the handler may have done part of its work), its message the
    /// error's text.
    async fn call<H, R, E>(
        &self,
        record: &Record,
        policy: &Policy,
        handler: &H,
        reconcile: Option<&R>,
    ) -> (Disposition, Option<(String, &'static str)>)
    where
        H: AsyncFn(&Record, &Attempt) -> Result<(), E>,
        R: AsyncFn(&Record) -> Result<bool, E>,
        E: Classify + std::fmt::Display,
    {
        let spec = retries::call(policy)
            .idempotent_if(self.cfg.idempotent)
            .budget(&*self.cfg.budget)
            .breaker(self.cfg.breaker.as_deref());
        let body = async |at: &Attempt| caught(handler(record, at)).await;
        let outcome: Result<(), Failure<Attempted<E>>> = match reconcile {
            Some(r) => {
                spec.reconcile(async |_| caught(r(record)).await.map(|done| done.then_some(())))
                    .outcome(body)
                    .await
            }
            None => spec.outcome(body).await,
        };
        let f = match outcome {
            Ok(()) => return (Disposition::Done, None),
            Err(f) => f,
        };
        let error = f
            .last_error()
            .map(|e| (e.to_string(), e.classify().kind().as_str()));
        let disposition = match f.reason() {
            Reason::CircuitOpen => Disposition::Hold,
            Reason::Permanent => Disposition::DeadLetter(Reason::Permanent),
            Reason::UnknownOutcome => Disposition::DeadLetter(Reason::UnknownOutcome),
            _ => {
                let next = record.level as usize;
                if next < self.cfg.topics.levels.len() {
                    Disposition::Republish(next)
                } else {
                    Disposition::DeadLetter(Reason::Exhausted)
                }
            }
        };
        (disposition, error)
    }

    /// Write the record to `topic` with its headers; wait for the ack.
    // Each argument is a header or a choice of this one write; a struct for
    // them would be built and taken apart at each of its three callers.
    #[allow(clippy::too_many_arguments)]
    async fn write(
        &self,
        m: &OwnedMessage,
        record: &Record,
        topic: &str,
        delay: Option<Duration>,
        error: Option<&(String, &'static str)>,
        reason: Option<Reason>,
        payload: bool,
    ) -> Result<(), KafkaError> {
        let due = delay.map(|d| now_ms().saturating_add(millis(d)).to_string());
        let attempt = (record.level + 1).to_string();
        let (partition, offset) = (record.partition.to_string(), record.offset.to_string());
        let key = record.idempotency_key.to_string();
        let first_seen = record.first_seen_ms.to_string();
        let mut headers = OwnedHeaders::new();
        // The user's own headers first, then ours (replacing older ones).
        if let Some(h) = m.headers() {
            for h in h.iter().filter(|h| !h.key.starts_with("retries-")) {
                headers = headers.insert(Header {
                    key: h.key,
                    value: h.value,
                });
            }
        }
        let mut put = |key: &str, value: &str| {
            headers = std::mem::take(&mut headers).insert(Header {
                key,
                value: Some(value),
            });
        };
        put("retries-attempt", &attempt);
        if let Some(due) = &due {
            put("retries-due-ms", due);
        }
        put("retries-first-seen-ms", &first_seen);
        put("retries-original-topic", &record.topic);
        put("retries-original-partition", &partition);
        put("retries-original-offset", &offset);
        put("retries-key", &key);
        if let Some((text, verdict)) = error {
            put("retries-error", text);
            put("retries-verdict", verdict);
        }
        if let Some(r) = reason {
            put("retries-reason", r.as_str());
        }
        if !payload {
            put("retries-payload", "dropped");
        }
        // Sent until acknowledged: a failure that may heal (the broker
        // down or restarting, a leader moving, a timeout) is waited out with
        // the runner's backoff, the record's offset still uncommitted; one
        // that cannot (the record too large) is the caller's to handle.
        let mut outage = Outage::new(self.cfg.outage_backoff, "a write");
        loop {
            let mut out = FutureRecord::<[u8], [u8]>::to(topic).headers(headers.clone());
            if let Some(k) = m.key() {
                out = out.key(k);
            }
            if let Some(p) = m.payload().filter(|_| payload) {
                out = out.payload(p);
            }
            match self.producer.send(out, Duration::from_secs(10)).await {
                Ok(_) => break,
                Err((e, _)) if too_large(&e) => return Err(e),
                Err((e, _)) => {
                    outage.begin(&e);
                    sleep_until(outage.until.take()).await;
                }
            }
        }
        outage.over();
        if let Some(hook) = &self.cfg.after_republish {
            hook(record, topic);
        }
        Ok(())
    }
}

impl Run<'_> {
    fn part(&mut self, at: &(String, i32)) -> &mut Part {
        let epochs = &mut self.epochs;
        self.parts.entry(at.clone()).or_insert_with(|| {
            *epochs += 1;
            Part {
                next: None,
                paused_since: None,
                running: None,
                queue: VecDeque::new(),
                full: false,
                epoch: *epochs,
            }
        })
    }

    /// A record from the consumer: started at once when its partition has
    /// nothing in flight, queued behind the one in flight otherwise.
    fn accept(&mut self, m: OwnedMessage) -> Option<Job> {
        let at = (m.topic().to_owned(), m.partition());
        let part = self.part(&at);
        if part.paused_since.is_some() && !part.full {
            // Fetched before the pause took effect: it will be read again
            // after the rewind.
            part.next = Some(part.next.map_or(m.offset(), |n| n.min(m.offset())));
            return None;
        }
        if part.next.is_some_and(|n| m.offset() < n) {
            self.cfg.stats.lock().expect("stats").duplicates_skipped += 1;
            return None;
        }
        if part.full {
            // Fetched before the pause for a full queue took effect.
            return None;
        }
        part.next = Some(m.offset() + 1);
        if part.running.is_some() {
            if part.queue.len() < QUEUE {
                part.queue.push_back(m);
            } else {
                self.hold_back(&at, m.offset());
            }
            return None;
        }
        self.begin(at, m)
    }

    /// Start the record at the head of its partition, unless it is not due
    /// yet: then the partition is paused and rewound to it until it is.
    fn begin(&mut self, at: (String, i32), m: OwnedMessage) -> Option<Job> {
        if let Some(&(offset, epoch)) = self.carried.get(&at)
            && offset == m.offset()
        {
            // Still in flight from before its partition was revoked and
            // assigned here again: not started twice. The new assignment
            // takes the job over, and commits it when it ends.
            self.carried.remove(&at);
            let part = self.part(&at);
            part.running = Some(offset);
            part.epoch = epoch;
            return None;
        }
        let level = self.cfg.topics.level_of(m.topic())?;
        let record = self.cfg.record_of(&m, level);
        // Not due yet: pause the partition until it is. A record is
        // republished due its level's delay after it failed, so a due time
        // further off than that is a clock skewed by more than the delay or
        // a header written by someone else: it is handled now (a retry a
        // little early) rather than stalling the partition behind it.
        if let Some(due) = record.due_ms {
            let now = now_ms();
            let delay = self.cfg.topics.delay_of(level).unwrap_or(Duration::ZERO);
            let wait = Duration::from_millis(due.saturating_sub(now));
            if !wait.is_zero() && wait <= delay {
                self.pause(&at, Rewind::To(m.offset()), later(wait));
                return None;
            }
        }
        let part = self.part(&at);
        part.running = Some(m.offset());
        Some(Job {
            epoch: part.epoch,
            at,
            m,
            record,
            level,
        })
    }

    /// A job ended: its offset is committed (with the next batch), or its
    /// partition paused for the breaker; the next queued record of its
    /// partition, if any, is started.
    fn finish(&mut self, f: &Finished) -> Option<Job> {
        if self.carried.get(&f.at) == Some(&(f.offset, f.epoch)) {
            // Revoked while it ran, and not (yet) assigned here again: the
            // next owner reads it again from the committed offset.
            self.carried.remove(&f.at);
            return None;
        }
        let part = self.parts.get_mut(&f.at)?;
        if part.epoch != f.epoch {
            return None;
        }
        part.running = None;
        match f.settled {
            Settled::Done => {
                lock(&self.context.finished).insert(f.at.clone(), f.offset + 1);
                self.resume_main();
            }
            Settled::Hold => {
                let until = later(self.cfg.probe_every);
                self.pause(&f.at, Rewind::To(f.offset), until);
                self.pause_main(until);
                return None;
            }
        }
        loop {
            let part = self.parts.get_mut(&f.at)?;
            let Some(m) = part.queue.pop_front() else {
                if std::mem::take(&mut part.full) {
                    self.wakes.insert((Instant::now(), f.at.0.clone(), f.at.1));
                }
                return None;
            };
            if let Some(job) = self.begin(f.at.clone(), m) {
                return Some(job);
            }
            if self.parts.get(&f.at).is_some_and(|p| p.running.is_some()) {
                // The job it carried over from before a revocation.
                return None;
            }
        }
    }

    /// The queue of `at` is full: stop fetching it, and read it again from
    /// `offset` (the first record not queued) once the queue has drained.
    fn hold_back(&mut self, at: &(String, i32), offset: i64) {
        let part = self.part(at);
        part.next = Some(offset);
        part.full = true;
        if part.paused_since.is_none() {
            part.paused_since = Some(Instant::now());
            self.pause_consumer(at);
        }
    }

    fn pause_consumer(&self, at: &(String, i32)) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&at.0, at.1);
        if let Err(e) = self.consumer.pause(&tpl) {
            // Not assigned any more: its state goes with the revocation.
            tracing::debug!(target: "retries_kafka", topic = at.0, partition = at.1, error = %e, "pause failed");
        }
    }

    /// Pause a partition until `until`, rewound as `rewind` says (what was
    /// queued behind is dropped: it is read again).
    fn pause(&mut self, at: &(String, i32), rewind: Rewind, until: Instant) {
        let part = self.part(at);
        match rewind {
            Rewind::To(offset) => part.next = Some(offset),
            Rewind::Unhandled => {
                if let Some(first) = part.queue.front() {
                    part.next = Some(first.offset());
                }
            }
        }
        part.queue.clear();
        part.full = false;
        if part.paused_since.is_none() {
            part.paused_since = Some(Instant::now());
            self.pause_consumer(at);
        }
        self.wakes.retain(|(_, t, p)| !(t == &at.0 && *p == at.1));
        self.wakes.insert((until, at.0.clone(), at.1));
    }

    /// The breaker is open: pause every assigned partition of the main topic.
    fn pause_main(&mut self, until: Instant) {
        if self.main_paused_at.is_none() {
            self.main_paused_at = Some(Instant::now());
            self.cfg.stats.lock().expect("stats").main_pauses += 1;
            tracing::warn!(target: "retries_kafka", topic = self.cfg.topics.main(), "breaker open: main topic paused");
        }
        let Ok(assignment) = self.consumer.assignment() else {
            return;
        };
        for e in assignment.elements_for_topic(self.cfg.topics.main()) {
            let at = (e.topic().to_owned(), e.partition());
            if self
                .parts
                .get(&at)
                .is_none_or(|p| p.paused_since.is_none() || p.full)
            {
                self.pause(&at, Rewind::Unhandled, until);
            }
        }
    }

    /// A record was handled (the breaker let it through): the main topic's
    /// pause, if any, is over once its partitions wake.
    fn resume_main(&mut self) {
        if let Some(at) = self.main_paused_at.take() {
            let paused = at.elapsed();
            self.cfg.stats.lock().expect("stats").main_paused += paused;
            metrics::histogram!("retry.kafka.paused", "topic" => self.cfg.topics.main().to_owned())
                .record(paused.as_secs_f64());
            tracing::info!(target: "retries_kafka", topic = self.cfg.topics.main(), paused_ms = millis(paused), "main topic resumed");
            // Wake the other paused main partitions now.
            let now = Instant::now();
            let main = self.cfg.topics.main().to_owned();
            let due: Vec<_> = self
                .wakes
                .iter()
                .filter(|(_, t, _)| *t == main)
                .cloned()
                .collect();
            for k in due {
                self.wakes.remove(&k);
                self.wakes.insert((now, k.1, k.2));
            }
        }
    }

    /// Resume every partition whose time has come, rewound to its next offset.
    fn wake(&mut self) {
        let now = Instant::now();
        while let Some((at, topic, partition)) = self.wakes.first() {
            if *at > now {
                break;
            }
            let (topic, partition) = (topic.clone(), *partition);
            self.wakes.pop_first();
            // Revoked since it was paused: nothing to resume.
            let Some(part) = self.parts.get_mut(&(topic.clone(), partition)) else {
                continue;
            };
            if let Some(since) = part.paused_since.take()
                && topic != self.cfg.topics.main()
            {
                metrics::histogram!("retry.kafka.paused", "topic" => topic.clone())
                    .record(since.elapsed().as_secs_f64());
            }
            if let Some(next) = part.next
                && let Err(e) = self.consumer.seek(
                    &topic,
                    partition,
                    Offset::Offset(next),
                    Duration::from_secs(5),
                )
            {
                tracing::debug!(target: "retries_kafka", topic, partition, error = %e, "seek failed");
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&topic, partition);
            if let Err(e) = self.consumer.resume(&tpl) {
                tracing::debug!(target: "retries_kafka", topic, partition, error = %e, "resume failed");
            }
        }
    }

    /// Forget the partitions revoked by a rebalance: their pauses, wake-ups,
    /// queues. A record of theirs still in flight is carried: if the
    /// partition comes back here before it ends, it is not started again
    /// (the new assignment takes it over); otherwise it ends uncommitted
    /// and its next owner reads it again.
    fn forget_revoked(&mut self) {
        let gone = std::mem::take(&mut *lock(&self.context.revoked));
        for at in gone {
            if let Some(part) = self.parts.remove(&at)
                && let Some(offset) = part.running
            {
                self.carried.insert(at.clone(), (offset, part.epoch));
            }
            self.wakes.retain(|(_, t, p)| !(*t == at.0 && *p == at.1));
        }
    }

    /// Commit, in one request, the offsets finished since the last commit.
    /// Asynchronously, one commit is in flight at a time: what finishes
    /// meanwhile goes with the next (so a commit's round trip sets the batch,
    /// not one request per record), tried again `COMMIT_AGAIN` later.
    fn commit_finished(&mut self, mode: CommitMode) {
        if matches!(mode, CommitMode::Async) {
            let mut committing = lock(&self.context.committing);
            // A commit whose callback never came (its reply lost with a
            // broker) holds the next one back one second at most.
            if committing.is_some_and(|since| since.elapsed() < Duration::from_secs(1)) {
                drop(committing);
                if !lock(&self.context.finished).is_empty() {
                    self.commit_again.get_or_insert_with(|| later(COMMIT_AGAIN));
                }
                return;
            }
            *committing = None;
        }
        let finished = std::mem::take(&mut *lock(&self.context.finished));
        if finished.is_empty() {
            return;
        }
        if matches!(mode, CommitMode::Async) {
            *lock(&self.context.committing) = Some(Instant::now());
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), next) in &finished {
            let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*next));
        }
        if let Err(e) = self.consumer.commit(&tpl, mode) {
            // Not committed: the records are read again by the next owner
            // (at least once), unless a later commit covers them.
            tracing::debug!(target: "retries_kafka", error = %e, "commit failed");
            let mut again = lock(&self.context.finished);
            for (at, next) in finished {
                again.entry(at).or_insert(next);
            }
        }
    }
}
