//! What a record carries and which of it is trusted: the [`Record`] a
//! handler sees, read from the main topic or a retry topic's `retries-*`
//! headers (see "Which headers are trusted" in the crate docs), its key
//! derived from its original coordinates, and the [`DeadLetter`] written for
//! it.

use crate::{RetryTopics, millis, now_ms};
use std::time::Duration;

use rdkafka::Message;
use rdkafka::message::{Headers, OwnedMessage};
use retries::{IdempotencyKey, Policy, Reason};

/// A record as the handler sees it: where it was first, its key and payload,
/// how many times it failed before, and its idempotency key (the same on
/// every copy).
#[derive(Debug, Clone)]
pub struct Record {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    pub(crate) level: u32,
    pub(crate) idempotency_key: IdempotencyKey,
    pub(crate) first_seen_ms: u64,
    pub(crate) due_ms: Option<u64>,
    pub(crate) error: Option<String>,
    /// A copy written by a shutdown that cut its handler mid-call
    /// (`retries-cut`): its outcome is unknown.
    pub(crate) cut: bool,
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

/// What the origin signature of a retry copy covers: everything that
/// decides how the copy is handled and under which key, so that a genuine
/// copy's headers moved onto another record sign nothing.
pub(crate) struct Signed<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) first_seen: &'a str,
    pub(crate) due: Option<&'a str>,
    /// The `retries-cut` mark's value.
    pub(crate) cut: Option<&'a str>,
    /// The Kafka record's key.
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) payload: Option<&'a [u8]>,
}

/// The origin signature of a retry copy: HMAC-SHA256 keyed by the
/// deployment's secret over [`Signed`], each part length-prefixed (an
/// absent part apart from an empty one), in hex.
pub(crate) fn origin_mac(secret: &[u8], signed: &Signed<'_>) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret)
        .expect("HMAC takes a key of any length");
    let mut part = |bytes: Option<&[u8]>| match bytes {
        None => mac.update(&[0]),
        Some(b) => {
            mac.update(&[1]);
            mac.update(&(b.len() as u64).to_be_bytes());
            mac.update(b);
        }
    };
    part(Some(b"retries-origin/2"));
    part(Some(signed.topic.as_bytes()));
    part(Some(&signed.partition.to_be_bytes()));
    part(Some(&signed.offset.to_be_bytes()));
    part(Some(signed.first_seen.as_bytes()));
    part(signed.due.map(str::as_bytes));
    part(signed.cut.map(str::as_bytes));
    part(signed.key);
    part(signed.payload);
    mac.finalize()
        .into_bytes()
        .iter()
        .fold(String::with_capacity(64), |mut s, b| {
            use std::fmt::Write;
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// `a == b` in a time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
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
    pub(crate) fn record_of(&self, m: &OwnedMessage, level: usize) -> Record {
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
        // The origin the record claims, all of it or nothing; with a secret,
        // only under a valid signature.
        let claimed = match (
            ours("retries-original-topic"),
            num("retries-original-partition").and_then(|p| i32::try_from(p).ok()),
            num("retries-original-offset"),
        ) {
            (Some(t), Some(p), Some(o)) => Some((t, p, o)),
            _ => None,
        };
        let first_seen = ours("retries-first-seen-ms");
        let claimed = claimed.filter(|(t, p, o)| match &self.origin_secret {
            None => true,
            Some(secret) => ours("retries-origin-mac").is_some_and(|mac| {
                let signed = Signed {
                    topic: t,
                    partition: *p,
                    offset: *o,
                    first_seen: first_seen.unwrap_or(""),
                    due: ours("retries-due-ms"),
                    cut: ours("retries-cut"),
                    key: m.key(),
                    payload: m.payload(),
                };
                same(origin_mac(secret, &signed).as_bytes(), mac.as_bytes())
            }),
        });
        // A record that claims no (valid) origin is its own, where it is:
        // in the retry topic, under that topic's name, so that its key can
        // never be a main record's, and its dead letter names where it was.
        let (topic, partition, offset, trusted) = match claimed {
            Some((t, p, o)) => (t.to_owned(), p, o, true),
            None if level == 0 => (
                self.topics.main().to_owned(),
                m.partition(),
                m.offset(),
                false,
            ),
            None => (m.topic().to_owned(), m.partition(), m.offset(), false),
        };
        // The key is a function of the original coordinates, so a copy
        // cannot claim another record's key: it is derived, never read.
        let idempotency_key = key_of(&topic, partition, offset);
        let unix_ms = |name: &str| if trusted { unix_ms(name) } else { None };
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
            cut: ours("retries-cut").is_some(),
        }
    }

    /// The time the record has left under the record deadline, if there is
    /// one (zero once it has passed).
    fn left(&self, record: &Record) -> Option<Duration> {
        let d = self.record_deadline?;
        let end = record.first_seen_ms.saturating_add(millis(d));
        Some(Duration::from_millis(end.saturating_sub(now_ms())))
    }

    pub(crate) fn expired(&self, record: &Record) -> bool {
        self.left(record).is_some_and(|left| left.is_zero())
    }

    /// The policy of the record's in-process call: the runner's, its
    /// deadline cut to the time the record has left; `None` when nothing
    /// valid is left.
    pub(crate) fn policy_for(&self, record: &Record) -> Option<Policy> {
        let policy = self.policy;
        match self.left(record) {
            None => Some(policy),
            Some(left) if left >= policy.deadline() => Some(policy),
            Some(left) if left.is_zero() => None,
            Some(left) => policy.with_deadline(left).try_validated().ok(),
        }
    }
}
