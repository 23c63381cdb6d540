//! The run loop: the consumer's stream and its errors (outages waited out,
//! rebalances), the handler's call on the engine for each record, and where
//! the record goes next (done, a retry topic, the dead-letter topic).

use crate::commits::{Finished, Job, Run, Settled};
use crate::consumer::{Outage, Rebalances, cannot_heal, sleep_until, too_large, unknown_topic};
use crate::{DeadLetter, Error, Record, RetryTopics, Stats, later, millis, now_ms};
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message};
use retries::{Attempt, Classify, Failure, Policy, Reason};

impl RetryTopics {
    pub(crate) async fn drive<H, R, E>(
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
        let consumer: Arc<StreamConsumer<Rebalances>> = Arc::new(
            config
                .set("enable.auto.commit", "false")
                .create_with_context(context.clone())?,
        );
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
            carried: HashMap::new(),
            queued_bytes: 0,
            draining: false,
            started: HashMap::new(),
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
                () = context.commit_done.notified() => {}
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
        self.drain_and_cut(&mut run, in_flight, &worker, reconcile.is_some())
            .await;
        run.forget_revoked();
        run.commit_finished(CommitMode::Sync);
        if let Some(at) = run.main_paused_at.take() {
            self.stats.lock().expect("stats").main_paused += at.elapsed();
        }
        let stats = self.stats.lock().expect("stats").clone();
        Ok(stats)
    }

    /// The end of `run`: the records in flight finish within
    /// [`drain`](Self::drain); those still in flight then are cut and, for a
    /// non-idempotent handler, handed on as unknown outcomes (see the crate
    /// docs' "Shutdown").
    async fn drain_and_cut<F: Future<Output = Finished>>(
        &self,
        run: &mut Run<'_>,
        mut in_flight: FuturesUnordered<F>,
        worker: &Worker<'_>,
        reconciled: bool,
    ) {
        // Drain: no record is started any more; those in flight finish
        // within the bound.
        run.draining = true;
        let bound = later(self.drain);
        while !in_flight.is_empty() {
            tokio::select! {
                biased;
                Some(finished) = in_flight.next() => {
                    run.finish(&finished);
                }
                () = sleep_until(Some(bound)) => break,
            }
        }
        // What is still in flight is cut. An idempotent handler's records
        // are not committed: the next owner runs them again. A
        // non-idempotent one's are handed on as unknown outcomes.
        let cut = run.cut();
        drop(in_flight);
        if !cut.is_empty() {
            tracing::info!(target: "retries_kafka", records = i64::try_from(cut.len()).unwrap_or(i64::MAX), drain_ms = millis(self.drain), "shutdown: records still in flight after the drain were cut");
        }
        let handing = async {
            for (at, m, level) in cut {
                worker.hand_on(&m, level, reconciled).await;
                run.handed_on(at, m.offset());
            }
        };
        if tokio::time::timeout(HAND_ON, handing).await.is_err() {
            tracing::warn!(target: "retries_kafka", "shutdown: records cut by it not all handed on in time; the rest are read again by the next owner");
        }
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
}

/// One attempt of the handler: its own error, or a panic (caught).
enum Attempted<E> {
    Failed(E),
    Panicked(String),
    /// The attempt a shutdown or its deadline cut in an earlier owner
    /// (`retries-cut`): it may have done its work.
    Cut,
}

impl<E: Classify> Classify for Attempted<E> {
    fn classify(&self) -> retries::Verdict {
        match self {
            Self::Failed(e) => e.classify(),
            // It may have done part of its work before it panicked.
            Self::Panicked(_) | Self::Cut => retries::Verdict::unknown(),
        }
    }
}

impl<E: std::fmt::Display> std::fmt::Display for Attempted<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Failed(e) => e.fmt(f),
            Self::Panicked(message) => write!(f, "the handler panicked: {message}"),
            Self::Cut => {
                f.write_str("cut mid-call in an earlier attempt (a shutdown or its deadline): the outcome is unknown")
            }
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

/// What the jobs share: the settings and the producer.
pub(crate) struct Worker<'r> {
    pub(crate) cfg: &'r RetryTopics,
    pub(crate) producer: &'r FutureProducer,
}

/// How long a shutdown waits for the writes that hand on the records it
/// cut.
const HAND_ON: Duration = Duration::from_secs(5);

/// The name of the handler's in-process calls. Their give-up is the
/// runner's to report (a republish is not one; a dead letter is, at WARN),
/// so the engine reports it at DEBUG.
static HANDLER: retries::observe::Name =
    retries::observe::Name::new("retries_kafka::handler").give_up_reported_by_owner();

/// How much of the record a write carries.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Whole {
    /// Key, payload, the record's own headers and the runner's.
    Record,
    /// All but the payload.
    NoPayload,
    /// The runner's headers alone.
    Minimal,
}

/// The bytes of the error's text a minimal dead letter keeps.
const MINIMAL_ERROR: usize = 1024;

/// `text` cut to at most `max` bytes, at a character boundary.
fn truncate(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// What the handler's call came to.
enum Disposition {
    Done,
    /// To the retry level given; `cut`: the attempt before was cut mid-call
    /// by its deadline (a non-idempotent handler's outcome is unknown), so
    /// the copy is marked `retries-cut: deadline` and its next owner asks
    /// `reconcile` before running the handler again.
    Republish {
        to: usize,
        cut: bool,
    },
    DeadLetter(Reason),
    /// The breaker is open, or the rate limit had no start in time:
    /// nothing was attempted.
    Hold,
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
                if let Disposition::Republish { cut, .. } = disposition
                    && self.cfg.expired(record)
                {
                    // No time left to look it up: a cut attempt's outcome
                    // stays unknown, and says so.
                    let reason = if cut {
                        Reason::UnknownOutcome
                    } else {
                        Reason::DeadlineExceeded
                    };
                    (Disposition::DeadLetter(reason), error)
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
                tracing::debug!(target: "retries_kafka", topic = m.topic(), partition = m.partition(), offset = m.offset(), level = i64::try_from(level).unwrap_or(i64::MAX), "record handled");
            }
            Disposition::Republish { to, cut } => {
                let topic = self.cfg.topics.level(to).expect("a level").to_owned();
                let delay = self.cfg.topics.levels[to].1;
                if let Err(e) = self
                    .write(
                        m,
                        record,
                        &topic,
                        Some(delay),
                        error.as_ref(),
                        None,
                        Whole::Record,
                        cut.then_some(("retries-cut", "deadline")),
                    )
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
    /// `retries-payload: dropped`); one too large even so (a key or headers
    /// over the limit) gets a minimal dead letter: the runner's headers
    /// alone (coordinates, key, reason, the error's first
    /// [`MINIMAL_ERROR`] bytes), no key, no payload, no headers of its own,
    /// and `retries-record: dropped`. Either way the dead letter is counted,
    /// measured and handed to `on_dead_letter`: no record is committed
    /// without a trace.
    async fn dead_letter(
        &self,
        m: &OwnedMessage,
        record: &Record,
        reason: Reason,
        mut error: Option<(String, &'static str)>,
    ) {
        let dlt = self.cfg.topics.dlt().to_owned();
        // Whole; too large: without the payload; too large even so: without
        // all of the record's own.
        let mut failed: Option<KafkaError> = None;
        for whole in [Whole::Record, Whole::NoPayload, Whole::Minimal] {
            if let Some(e) = &failed {
                let without = match whole {
                    Whole::Minimal => "its key, headers and payload",
                    _ => "its payload",
                };
                let mut text = format!(
                    "{}; dead-lettered without {without} ({e})",
                    error.as_ref().map_or("no error", |e| e.0.as_str())
                );
                if whole == Whole::Minimal {
                    truncate(&mut text, MINIMAL_ERROR);
                }
                error = Some((text, error.as_ref().map_or("unknown", |e| e.1)));
            }
            match self
                .write(
                    m,
                    record,
                    &dlt,
                    None,
                    error.as_ref(),
                    Some(reason),
                    whole,
                    None,
                )
                .await
            {
                Ok(()) => {
                    failed = None;
                    break;
                }
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = &failed {
            // Not even the runner's headers fit: the broker's limit is below
            // a few hundred bytes. The dead letter is still counted and
            // handed to the hook.
            tracing::error!(target: "retries_kafka", topic = m.topic(), partition = m.partition(), offset = m.offset(), error = %e, "not even a minimal dead letter fits the broker's limit");
        }
        self.cfg.stats.lock().expect("stats").dead_lettered += 1;
        metrics::counter!("retry.kafka.dead_lettered", "topic" => self.cfg.topics.main().to_owned(), "reason" => reason.as_str()).increment(1);
        tracing::warn!(target: "retries_kafka", topic = m.topic(), partition = m.partition(), offset = m.offset(), reason = reason.as_str(), error = error.as_ref().map_or("", |e| e.0.as_str()), "record dead-lettered");
        if let Some(hook) = &self.cfg.on_dead_letter {
            let error = error.map(|e| e.0);
            hook(record, &DeadLetter { reason, error });
        }
    }

    /// Hand on a record of a non-idempotent handler that a shutdown cut
    /// mid-call: its outcome is unknown, so it must not be run again as if
    /// new. With a `reconcile`, a copy goes back to the retry level it was
    /// at (the first, from the main topic), due at once and marked
    /// `retries-cut: shutdown`: its next owner asks `reconcile` before
    /// running the handler again. Without one (or without retry levels),
    /// it is dead-lettered `unknown_outcome`, as the next owner would.
    async fn hand_on(&self, m: &OwnedMessage, level: usize, reconciled: bool) {
        let mut record = self.cfg.record_of(m, level);
        let error = Some((
            format!(
                "cut by a shutdown after its drain ({} ms): the outcome is unknown",
                millis(self.cfg.drain)
            ),
            "unknown",
        ));
        let target = level.saturating_sub(1);
        match self.cfg.topics.level(target).map(str::to_owned) {
            Some(topic) if reconciled => {
                record.level = u32::try_from(target).unwrap_or(u32::MAX);
                let mark = Some(("retries-cut", "shutdown"));
                let written = self
                    .write(
                        m,
                        &record,
                        &topic,
                        Some(Duration::ZERO),
                        error.as_ref(),
                        None,
                        Whole::Record,
                        mark,
                    )
                    .await;
                if written.is_err() {
                    // Too large to copy: dead-lettered instead.
                    self.dead_letter(m, &record, Reason::UnknownOutcome, error)
                        .await;
                }
            }
            _ => {
                self.dead_letter(m, &record, Reason::UnknownOutcome, error)
                    .await;
            }
        }
        self.cfg.stats.lock().expect("stats").cut += 1;
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
            .name(&HANDLER)
            .idempotent_if(self.cfg.idempotent)
            .budget(&*self.cfg.budget)
            .breaker(self.cfg.breaker.as_deref())
            .rate_limit_opt(self.cfg.rate.as_deref());
        // A record a shutdown cut mid-call: its first attempt here is the
        // one that was cut, an unknown outcome, so the engine's rules apply
        // to it (a non-idempotent handler's is looked up with `reconcile`,
        // or dead-lettered `unknown_outcome`; never run again blindly).
        let cut = record.cut && !self.cfg.idempotent;
        let body = async |at: &Attempt| {
            if cut && at.number() == 1 {
                return Err(Attempted::Cut);
            }
            caught(handler(record, at)).await
        };
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
        // The deadline cut a non-idempotent handler mid-call: it may have
        // applied its effect, so its outcome is unknown, as a shutdown's cut
        // is. With a `reconcile` the record goes on, marked, and its next
        // owner looks it up before running it again; without one it is
        // dead-lettered `unknown_outcome`. Never republished as if nothing
        // had run.
        let cut = f.reason() == Reason::DeadlineExceeded
            && f.last_attempt_cut_off()
            && !self.cfg.idempotent;
        let error = if cut {
            Some((
                format!(
                    "cut by the call's deadline mid-call after {} ms: the outcome is unknown{}",
                    millis(f.elapsed()),
                    f.last_error()
                        .map(|e| format!(" (the attempt before it failed: {e})"))
                        .unwrap_or_default()
                ),
                "unknown",
            ))
        } else {
            f.last_error()
                .map(|e| (e.to_string(), e.classify().kind().as_str()))
        };
        let next = record.level as usize;
        let disposition = match f.reason() {
            // Nothing was attempted: held, as for an open breaker.
            Reason::CircuitOpen | Reason::RateLimited => Disposition::Hold,
            Reason::Permanent => Disposition::DeadLetter(Reason::Permanent),
            Reason::UnknownOutcome => Disposition::DeadLetter(Reason::UnknownOutcome),
            _ if cut && reconcile.is_none() => Disposition::DeadLetter(Reason::UnknownOutcome),
            _ if next < self.cfg.topics.levels.len() => Disposition::Republish { to: next, cut },
            _ if cut => Disposition::DeadLetter(Reason::UnknownOutcome),
            _ => Disposition::DeadLetter(Reason::Exhausted),
        };
        (disposition, error)
    }

    /// Write the record to `topic` with its headers; wait for the ack.
    // Each argument is a header or a choice of this one write; a struct for
    // them would be built and taken apart at each of its three callers.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn write(
        &self,
        m: &OwnedMessage,
        record: &Record,
        topic: &str,
        delay: Option<Duration>,
        error: Option<&(String, &'static str)>,
        reason: Option<Reason>,
        whole: Whole,
        mark: Option<(&str, &str)>,
    ) -> Result<(), KafkaError> {
        let due = delay.map(|d| now_ms().saturating_add(millis(d)).to_string());
        let attempt = (record.level + 1).to_string();
        let (partition, offset) = (record.partition.to_string(), record.offset.to_string());
        let key = record.idempotency_key.to_string();
        let first_seen = record.first_seen_ms.to_string();
        let mut headers = OwnedHeaders::new();
        // The user's own headers first, then ours (replacing older ones).
        if let Some(h) = m.headers().filter(|_| whole != Whole::Minimal) {
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
        let key_out = m.key().filter(|_| whole != Whole::Minimal);
        let payload_out = m.payload().filter(|_| whole == Whole::Record);
        if let Some(secret) = &self.cfg.origin_secret {
            let mac = crate::headers::origin_mac(
                secret,
                &crate::headers::Signed {
                    topic: &record.topic,
                    partition: record.partition,
                    offset: record.offset,
                    first_seen: &first_seen,
                    due: due.as_deref(),
                    cut: mark.filter(|m| m.0 == "retries-cut").map(|m| m.1),
                    key: key_out,
                    payload: payload_out,
                },
            );
            put("retries-origin-mac", &mac);
        }
        put("retries-key", &key);
        if let Some((text, verdict)) = error {
            put("retries-error", text);
            put("retries-verdict", verdict);
        }
        if let Some(r) = reason {
            put("retries-reason", r.as_str());
        }
        if whole != Whole::Record {
            put("retries-payload", "dropped");
        }
        if whole == Whole::Minimal {
            put("retries-record", "dropped");
        }
        if let Some((name, value)) = mark {
            put(name, value);
        }
        // Sent until acknowledged: a failure that may heal (the broker
        // down or restarting, a leader moving, a timeout) is waited out with
        // the runner's backoff, the record's offset still uncommitted; one
        // that cannot (the record too large) is the caller's to handle.
        let mut outage = Outage::new(self.cfg.outage_backoff, "a write");
        loop {
            let mut out = FutureRecord::<[u8], [u8]>::to(topic).headers(headers.clone());
            if let Some(k) = key_out {
                out = out.key(k);
            }
            if let Some(p) = payload_out {
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
