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
//! | `retries-cut` | `shutdown` or `deadline`: the attempt before was cut mid-call, its outcome unknown (below) |
//! | `retries-origin-mac` | with [`RetryTopics::origin_secret`]: the copy's signature (below) |
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
//! access may write a record there. The key is never read: it is derived
//! again from the original coordinates the record claims. A record that
//! claims none (no origin headers, or one that does not parse) is its own
//! origin: its key is that of its coordinates *in the retry topic* (the
//! topic's own name, partition and offset), so it can never take a main
//! record's key, and a dead letter for it names where it really was. With
//! [`RetryTopics::origin_secret`] the runner signs each copy it writes
//! (HMAC-SHA256 over its origin, first-seen and due times, `retries-cut`
//! mark, Kafka key and payload) and a claimed origin counts only with a
//! valid signature, so no writer without the secret can give a record
//! another record's key: a genuine copy's headers put on another payload
//! (or key, or due time) sign nothing, and that record is keyed by its own
//! coordinates;
//! without a secret, a writer who copies a real record's origin headers can
//! (set one where the retry topics are writable by others). A value that
//! does not parse is taken as missing; a first-seen time in the future is
//! taken as now; a due time further off than the level's delay is taken as
//! due (below).
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
//!    deadline (and the record dead-lettered, never committed as done). A
//!    non-idempotent handler cut off mid-call by either deadline may have
//!    applied its effect: its outcome is unknown, as a shutdown's cut is
//!    (below). With `reconcile` and time left it goes to the next level
//!    marked `retries-cut: deadline`, and its next owner asks `reconcile`
//!    before running it again; otherwise it is dead-lettered
//!    `unknown_outcome`, its error naming the cut. It is never republished
//!    as if nothing had run.
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
//!    kept, `retries-payload: dropped`). One too large even so (a key or
//!    headers over the limit) gets a minimal dead letter: no key, no
//!    payload, none of its own headers; the runner's headers alone (its
//!    original coordinates, `retries-key`, the reason, the error's first
//!    1,024 bytes), `retries-payload: dropped` and `retries-record:
//!    dropped`. Every dead letter, whole or not, is counted
//!    ([`Stats::dead_lettered`], `retry.kafka.dead_lettered`), logged once
//!    at WARN and handed to [`RetryTopics::on_dead_letter`]: no record is
//!    committed without a trace.
//! 5. The original's offset is committed only after the republish (or the
//!    dead-letter write) is acknowledged (`acks=all`). A process killed in
//!    between re-reads the record and republishes it again: at least once,
//!    with the same `retries-key`, so the handler can deduplicate.
//!
//! # Redrive
//!
//! [`RetryTopics::redrive`] sends the dead-letter topic's records again at
//! the operator's rate (after a fix is deployed): each goes to the first
//! retry topic under its original coordinates, so its idempotency key is
//! the one it died with, with a new first-seen time and the mark
//! `retries-cut: redrive`, so that a non-idempotent handler's `reconcile`
//! is asked before the handler runs again. The dead-letter topic is read
//! by the group `GROUP-redrive`: a redrive run twice sends nothing twice.
//!
//! # Concurrency and commits
//!
//! Up to [`RetryTopics::concurrency`] records are in flight at once (16 by
//! default), in one task (the handler needs no `Send`): records of
//! different partitions, of the main topic and of each retry level, run
//! concurrently; the records of one partition run one at a time, in order
//! (those fetched meanwhile wait in a queue of at most 1,024, then the
//! partition is paused until it drains). The queues hold at most
//! [`RetryTopics::max_queued_bytes`] across partitions (64 MiB by default):
//! past it, the partition whose record would not fit is paused and rewound
//! the same way, so memory is bounded by bytes whatever the records' size —
//! about that bound, plus librdkafka's prefetch
//! (`queued.max.messages.kbytes`, 64 MiB by default), plus the records in
//! flight. A record's offset is committed
//! once it is finished (handled, or its republish or dead letter
//! acknowledged), off the run loop, together with every other offset
//! finished since the last commit, one commit in flight at a time (so under
//! load a batch is whatever finished during one commit's round trip, and an
//! idle consumer commits at once). Each commit is a synchronous one on
//! tokio's blocking pool, so its end is seen: librdkafka posts no result
//! for an asynchronous commit of explicit offsets on this consumer, and
//! commits paced by a fallback timer lagged by a second of records (about
//! 450 at 450 records a second in the test
//! `commits_follow_the_handled_records_within_a_round_trip`, within a few
//! now). Since each partition runs in order, a
//! committed offset is never past an unfinished record. A process that dies
//! re-reads what finished after its last landed commit (at least once, the
//! same `retries-key`). `run` ending commits what is finished synchronously
//! (see [Shutdown](#shutdown)).
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
//! # Shutdown
//!
//! When `run`'s shutdown future completes, no record is started any more
//! (those queued are left uncommitted for the next owner, which reads them
//! as new: none of them ran). The records in flight finish within
//! [`RetryTopics::drain`] (10 s by default) and are committed with the
//! final, synchronous commit. A record still in flight after the drain is
//! cut mid-call, so its outcome is unknown:
//!
//! * an idempotent handler's is left uncommitted: the next owner runs it
//!   again;
//! * a non-idempotent one's ([`RetryTopics::not_idempotent`]) is never run
//!   again blindly. With [`RetryTopics::run_reconciled`], a copy goes back
//!   to the retry level it was at (the first, from the main topic), due at
//!   once, marked `retries-cut: shutdown`; the consumer that reads it counts
//!   the cut attempt as its first, an unknown outcome, so the engine asks
//!   `reconcile` before running the handler (done: committed; not done:
//!   run). Without `reconcile`, or without retry levels, it is
//!   dead-lettered `unknown_outcome`. Either way its offset is committed once
//!   the write is acknowledged ([`Stats::cut`] counts them); a write not
//!   acknowledged within 5 s (the broker gone too) leaves the record
//!   uncommitted, to be read again as new: the at-least-once fallback,
//!   with its `retries-key` for the handler to deduplicate by.
//!
//! The marker is a retry-topic header like the others: a writer of the
//! retry topics can set it, which only makes the next owner look the
//! record up before running it.
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
//! paused). Tracing, target `retries_kafka`, as tower and hyper log: a
//! record handled or republished is DEBUG; each thing that gives up is one
//! WARN, once:
//!
//! | what | level | message |
//! |---|---|---|
//! | a record handled, republished | DEBUG | `record handled`, `record republished` |
//! | a record dead-lettered (whole, without its payload, or minimal) | WARN | `record dead-lettered` (`topic`, `partition`, `offset`, `reason`, `error`) |
//! | the handler's in-process call gave up | DEBUG | the engine's `call failed`, function `retries_kafka::handler` (the runner's own line says what became of the record) |
//! | the main topic paused by the breaker, resumed | WARN, INFO | `breaker open: main topic paused`, `main topic resumed` |
//! | an outage starts, ends | WARN, INFO | `broker error: waiting it out`, `broker error over` |
//! | the consumer not polled within `max.poll.interval.ms` (every slot taken by slow handlers, or a handler blocking its thread) | WARN | `too slow: …` (not a broker error) |
//! | a commit that took 1 s or more | INFO | `commit slow` (`took_ms`, `partitions`) |
//! | partitions revoked by a rebalance; assigned | INFO; DEBUG | `partitions revoked`; `partitions assigned` |
//! | topics missing at start, waited for | INFO | `topics missing: waiting for them to appear` (`missing`, `wait_ms`) |
//! | a topic created | INFO | `topic created` |

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::error::KafkaError;
use retries::{Attempt, Backoff, CircuitBreaker, Classify, Policy, TokenBucket};

pub mod broker;
mod commits;
mod consumer;
mod headers;
mod redrive;
mod runner;
mod topics;

pub use headers::{DeadLetter, Record};
pub use topics::Topics;

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
    /// Records of a non-idempotent handler cut by a shutdown after its
    /// drain ([`RetryTopics::drain`]) and handed on as unknown outcomes.
    pub cut: u64,
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
    /// [`RetryTopics::redrive`] on a runner without a retry topic: a
    /// record sent again needs one to go to.
    #[error("redrive needs a retry topic to send the dead letters to")]
    NoRetryTopic,
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
    rate: Option<Arc<retries::limit::RateLimit>>,
    probe_every: Duration,
    stats: Arc<Mutex<Stats>>,
    settings: Vec<(String, String)>,
    producer_settings: Vec<(String, String)>,
    concurrency: usize,
    queued_bytes: usize,
    drain: Duration,
    create_topics: Option<i32>,
    topic_wait: Duration,
    outage_backoff: Backoff,
    after_republish: Option<RepublishHook>,
    on_dead_letter: Option<DeadLetterHook>,
    /// The key of the origin signature, if one is set.
    origin_secret: Option<Arc<[u8]>>,
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
            rate: None,
            probe_every: Duration::from_secs(1),
            stats: Arc::default(),
            settings: Vec::new(),
            producer_settings: Vec::new(),
            concurrency: 16,
            queued_bytes: DEFAULT_QUEUED_BYTES,
            drain: Duration::from_secs(10),
            create_topics: None,
            topic_wait: Duration::from_secs(10),
            outage_backoff: Backoff::exponential(
                Duration::from_millis(100),
                2.0,
                Duration::from_secs(5),
            ),
            after_republish: None,
            on_dead_letter: None,
            origin_secret: None,
        }
    }

    /// Sign the origin of every retry copy this runner writes (HMAC-SHA256
    /// of its original coordinates and first-seen time, keyed by `secret`,
    /// in the header `retries-origin-mac`), and trust a retry-topic record's
    /// origin only when its signature checks: a record written to a retry
    /// topic by anyone else (a forged origin, a copy of another record's
    /// headers with a changed payload) is then keyed by its own coordinates
    /// (see "Which headers are trusted" in the crate docs). Give every runner
    /// of the deployment the same secret, at least 16 bytes, from your secret
    /// store; changing it makes the copies in flight untrusted (handled once
    /// more under their own keys).
    #[must_use]
    pub fn origin_secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.origin_secret = Some(secret.into().into());
        self
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

    /// At most `bytes` of records (keys, payloads and headers) queued behind
    /// the records in flight, across every partition (64 MiB by default, as
    /// librdkafka caps its own prefetch with `queued.max.messages.kbytes`):
    /// a partition whose next record would pass the bound is paused and
    /// rewound to it, and resumed once its own queue has drained, so the
    /// records beyond the bound stay in the broker (see the
    /// [crate docs](crate#concurrency-and-commits)). Each partition still
    /// runs one record at a time, whatever its size.
    #[must_use]
    pub fn max_queued_bytes(mut self, bytes: usize) -> Self {
        self.queued_bytes = bytes;
        self
    }

    /// How long a shutdown waits for the records in flight (10 s by
    /// default): once `run`'s shutdown future completes, no record is
    /// started; those in flight finish (handled, republished or
    /// dead-lettered, and committed) within `drain`. A record still in
    /// flight after it is cut mid-call, its outcome unknown: an idempotent
    /// handler's is left uncommitted (its next owner runs it again); a
    /// non-idempotent one's is handed on as an unknown outcome, never run
    /// again blindly (see the [crate docs](crate#shutdown)).
    #[must_use]
    pub fn drain(mut self, drain: Duration) -> Self {
        self.drain = drain;
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

    /// Draw every handler attempt (every record's, every retry level's,
    /// every partition's) from `limit`, the quota of what the handler
    /// calls: an attempt waits for its start within the record's policy
    /// deadline; a record whose start cannot come in time is not run and
    /// is held, its partition paused and tried again as for an open
    /// breaker ([`probe_every`](Self::probe_every)), never republished or
    /// dead-lettered for it. Pass an `Arc` to share one limit with other
    /// callers of the same service.
    #[must_use]
    pub fn rate_limit(mut self, limit: impl Into<Arc<retries::limit::RateLimit>>) -> Self {
        self.rate = Some(limit.into());
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
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
/// The default of [`RetryTopics::max_queued_bytes`]: 64 MiB.
const DEFAULT_QUEUED_BYTES: usize = 64 << 20;

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
