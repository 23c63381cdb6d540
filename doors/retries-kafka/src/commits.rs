//! Partitions and commits: each partition's record in flight and its
//! queue, pauses and wake-ups, and the offsets committed once every record
//! before them is finished.

use crate::consumer::Rebalances;
use crate::{Record, RetryTopics, later, lock, millis, now_ms};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, OwnedMessage};
use rdkafka::{Message, Offset, TopicPartitionList};

/// A partition's state in this assignment.
#[derive(Debug)]
pub(crate) struct Part {
    /// The offset the partition is expected at next: every record before it
    /// is finished, in flight or queued. After a rewind: the record to read
    /// again.
    pub(crate) next: Option<i64>,
    /// Paused since (and until the wake-up).
    pub(crate) paused_since: Option<Instant>,
    /// The offset of this partition's record in flight, if any.
    pub(crate) running: Option<i64>,
    /// Records fetched while one was in flight, in order.
    pub(crate) queue: VecDeque<OwnedMessage>,
    /// Paused because the queue is full: resumed once it has drained.
    pub(crate) full: bool,
    /// Which assignment of the partition this is: a record finished for an
    /// earlier one (revoked since) is not committed.
    pub(crate) epoch: u64,
}

/// At most this many records are queued behind a partition's record in
/// flight; then the partition is paused (and rewound to the first record not
/// queued) until its queue has drained.
const QUEUE: usize = 1024;

/// A record to handle, taken from its partition in order.
pub(crate) struct Job {
    pub(crate) at: (String, i32),
    pub(crate) epoch: u64,
    /// Shared with [`Run::started`] (for a non-idempotent handler), which
    /// hands the record on if a shutdown cuts its call.
    pub(crate) m: Arc<OwnedMessage>,
    pub(crate) record: Record,
    pub(crate) level: usize,
}

/// A job's end.
pub(crate) struct Finished {
    pub(crate) at: (String, i32),
    pub(crate) epoch: u64,
    pub(crate) offset: i64,
    pub(crate) settled: Settled,
}

/// What became of a record.
pub(crate) enum Settled {
    /// Handled, republished or dead-lettered (and the write acknowledged):
    /// its offset may be committed.
    Done,
    /// The breaker is open: nothing was attempted; the record is read again
    /// after the probe period.
    Hold,
}

/// The state of one `run`: partitions, their pauses and wake-ups. Touched
/// only by the run loop, between jobs.
pub(crate) struct Run<'r> {
    pub(crate) cfg: &'r RetryTopics,
    pub(crate) consumer: &'r Arc<StreamConsumer<Rebalances>>,
    pub(crate) context: &'r Rebalances,
    pub(crate) parts: HashMap<(String, i32), Part>,
    /// Paused partitions by when they resume.
    pub(crate) wakes: BTreeSet<(Instant, String, i32)>,
    pub(crate) main_paused_at: Option<Instant>,
    /// Assignments seen, to number them.
    pub(crate) epochs: u64,
    /// Records in flight when their partition was revoked: offset and the
    /// revoked assignment's epoch.
    pub(crate) carried: HashMap<(String, i32), (i64, u64)>,
    /// The bytes of every partition's queue
    /// ([`RetryTopics::max_queued_bytes`] bounds it).
    pub(crate) queued_bytes: usize,
    /// Shutting down: a job that ends starts no queued record.
    pub(crate) draining: bool,
    /// Each partition's record in flight, and its level: what a shutdown
    /// that cuts it must hand on.
    pub(crate) started: HashMap<(String, i32), (Arc<OwnedMessage>, usize)>,
}

/// What a record holds in memory, as far as its size goes: key, payload
/// and headers.
pub(crate) fn size_of(m: &OwnedMessage) -> usize {
    let headers = m.headers().map_or(0, |h| {
        h.iter()
            .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
            .sum()
    });
    m.key().map_or(0, <[u8]>::len) + m.payload().map_or(0, <[u8]>::len) + headers
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
    pub(crate) fn accept(&mut self, m: OwnedMessage) -> Option<Job> {
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
            let size = size_of(&m);
            let fits = self.queued_bytes.saturating_add(size) <= self.cfg.queued_bytes;
            let part = self.part(&at);
            if part.queue.len() < QUEUE && fits {
                part.queue.push_back(m);
                self.queued_bytes += size;
            } else {
                self.hold_back(&at, m.offset());
            }
            return None;
        }
        self.begin(at, m)
    }

    /// Start the record at the head of its partition, unless it is not due
    /// yet: then the partition is paused and rewound to it until it is.
    pub(crate) fn begin(&mut self, at: (String, i32), m: OwnedMessage) -> Option<Job> {
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
        let m = Arc::new(m);
        if !self.cfg.idempotent {
            // Only a non-idempotent handler's record is handed on when a
            // shutdown cuts it (an idempotent one is read again).
            self.started.insert(at.clone(), (Arc::clone(&m), level));
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
    pub(crate) fn finish(&mut self, f: &Finished) -> Option<Job> {
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
        self.started.remove(&f.at);
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
        if self.draining {
            return None;
        }
        loop {
            let part = self.parts.get_mut(&f.at)?;
            let Some(m) = part.queue.pop_front() else {
                if std::mem::take(&mut part.full) {
                    self.wakes.insert((Instant::now(), f.at.0.clone(), f.at.1));
                }
                return None;
            };
            self.queued_bytes -= size_of(&m);
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
        let dropped: usize = part.queue.drain(..).map(|m| size_of(&m)).sum();
        part.full = false;
        let pause = part.paused_since.is_none();
        if pause {
            part.paused_since = Some(Instant::now());
        }
        self.queued_bytes -= dropped;
        if pause {
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
    pub(crate) fn wake(&mut self) {
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

    /// The records a shutdown cut, still in flight on partitions assigned
    /// here (a revoked partition's record is its next owner's).
    pub(crate) fn cut(&mut self) -> Vec<((String, i32), Arc<OwnedMessage>, usize)> {
        let started = std::mem::take(&mut self.started);
        started
            .into_iter()
            .filter(|(at, (m, _))| {
                self.parts
                    .get(at)
                    .is_some_and(|p| p.running == Some(m.offset()))
            })
            .map(|(at, (m, level))| (at, m, level))
            .collect()
    }

    /// A cut record was handed on (its copy or dead letter acknowledged):
    /// its offset is committed with the final commit.
    pub(crate) fn handed_on(&mut self, at: (String, i32), offset: i64) {
        lock(&self.context.finished).insert(at, offset + 1);
    }

    /// Forget the partitions revoked by a rebalance: their pauses, wake-ups,
    /// queues. A record of theirs still in flight is carried: if the
    /// partition comes back here before it ends, it is not started again
    /// (the new assignment takes it over); otherwise it ends uncommitted
    /// and its next owner reads it again.
    pub(crate) fn forget_revoked(&mut self) {
        let gone = std::mem::take(&mut *lock(&self.context.revoked));
        for at in gone {
            if let Some(part) = self.parts.remove(&at) {
                self.queued_bytes -= part.queue.iter().map(size_of).sum::<usize>();
                if let Some(offset) = part.running {
                    self.carried.insert(at.clone(), (offset, part.epoch));
                }
            }
            self.wakes.retain(|(_, t, p)| !(*t == at.0 && *p == at.1));
        }
    }

    /// Commit, in one request, the offsets finished since the last commit.
    ///
    /// While running (`CommitMode::Async` here): one commit at a time, run
    /// synchronously on tokio's blocking pool, so that its end is observed
    /// (librdkafka reports nothing for an asynchronous commit of explicit
    /// offsets on this consumer: the callback never came, and commits were
    /// paced by a one-second fallback). What finishes while one is in flight
    /// goes with the next, started as soon as it ends ([`Rebalances::commit_done`]):
    /// a batch is what finished during one round trip, and an idle consumer
    /// commits at once. At the end (`Sync`): after the one in flight (so an
    /// older commit cannot land after it), on this thread.
    pub(crate) fn commit_finished(&mut self, mode: CommitMode) {
        let running = matches!(mode, CommitMode::Async);
        if running {
            let committing = lock(&self.context.committing);
            // A commit that has not returned in this long (a broker gone
            // mid-request) holds the next one back no longer.
            if committing.is_some_and(|since| since.elapsed() < COMMIT_STUCK) {
                return;
            }
        } else {
            let t0 = Instant::now();
            while lock(&self.context.committing).is_some() && t0.elapsed() < COMMIT_STUCK {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let finished = std::mem::take(&mut *lock(&self.context.finished));
        if finished.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), next) in &finished {
            let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*next));
        }
        if !running {
            if let Err(e) = self.consumer.commit(&tpl, CommitMode::Sync) {
                tracing::debug!(target: "retries_kafka", error = %e, "final commit failed");
            }
            return;
        }
        *lock(&self.context.committing) = Some(Instant::now());
        // What the commit touches when it returns (not the whole context,
        // whose client name would be copied for each commit).
        let consumer = Arc::clone(self.consumer);
        let again = Arc::clone(&self.context.finished);
        let committing = Arc::clone(&self.context.committing);
        let done = Arc::clone(&self.context.commit_done);
        tokio::task::spawn_blocking(move || {
            let t0 = Instant::now();
            let result = consumer.commit(&tpl, CommitMode::Sync);
            let took = t0.elapsed();
            if took >= COMMIT_SLOW {
                // What finishes meanwhile waits for this one: a slow commit
                // is the lag a crash would re-read.
                tracing::info!(target: "retries_kafka", took_ms = crate::millis(took), partitions = i64::try_from(finished.len()).unwrap_or(i64::MAX), "commit slow");
            }
            if let Err(e) = result {
                // Not committed: the next commit covers these partitions
                // (unless a later offset is already waiting), else the next
                // owner reads the records again (at least once).
                tracing::debug!(target: "retries_kafka", error = %e, "commit failed");
                let mut again = lock(&again);
                for (at, next) in finished {
                    again.entry(at).or_insert(next);
                }
            }
            *lock(&committing) = None;
            done.notify_one();
        });
    }
}

/// A commit that takes this long is logged at INFO (`commit slow`).
const COMMIT_SLOW: Duration = Duration::from_secs(1);

/// How long a commit may stay unanswered before the next one goes anyway.
const COMMIT_STUCK: Duration = Duration::from_secs(5);

/// Where a pause rewinds its partition to.
#[derive(Clone, Copy)]
pub(crate) enum Rewind {
    /// This offset: the record there is read again.
    To(i64),
    /// The first record not yet handled nor in flight.
    Unhandled,
}
