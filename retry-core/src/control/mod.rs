//! Operator control at run time: overrides by call name that take effect
//! from the next call, revert by themselves, and keep what the call sites
//! learned.
//!
//! During an incident the people on call need levers that do not wait for
//! a deploy. An [`Override`] is installed for a call name (the name its
//! metrics and spans carry: a `#[retryable]` fn's path, a named `call`, a
//! door's route such as `POST /charges` or a gRPC method), or for `*`
//! (every call without an override of its own), for a time to live:
//!
//! | lever | what a call under it does |
//! |---|---|
//! | `retries: off` ([`Override::retries_off`]) | its first attempt only; no hedges |
//! | `unknown: stop` ([`Unknown::Stop`]) | an unknown outcome is never sent again, idempotent or not: `reconcile` still runs and its answer is taken when it found the work done, else the call stops with [`Reason::UnknownOutcome`](crate::Reason::UnknownOutcome); refusals (not executed) are still retried |
//! | `unknown: reconcile-only` ([`Unknown::ReconcileOnly`]) | an unknown outcome is sent again only after `reconcile` said the work was not done (an idempotent call too); without `reconcile` it stops |
//! | `share` ([`Override::share`]) | this percentage of calls may retry; the others make their first attempt only |
//! | `policy` ([`Override::policy`]) | this policy instead of its own (deadline, attempts, attempt timeout, backoff), validated by the rules of the attribute |
//! | `breaker` ([`Force`]) | its breaker forced open (refused at once, [`Reason::CircuitOpen`](crate::Reason::CircuitOpen)), forced closed (not consulted), or automatic |
//!
//! # What an override keeps
//!
//! Installing, changing or removing an override keeps every piece of live
//! state of the call sites it touches: the breaker's state (a breaker
//! forced open or closed is neither consulted nor told while forced, so it
//! is where it was when the override ends), the budget's tokens, the
//! admission's window and a learned hedge delay. Changes are atomic: the
//! set of overrides is replaced as a whole, so a call sees the old set or
//! the new one, never half; a call reads the set once, when it starts.
//!
//! An override is read once per call, when its first attempt is admitted
//! (a hedged call: before its first copy). A replacement policy's deadline
//! applies from there, except to a call whose deadline was fixed before it
//! (a call that waited for a slot of its concurrency limit keeps its own
//! deadline; its attempts and backoff follow the replacement).
//!
//! # Time to live
//!
//! Every override has one (at most [`MAX_TTL`], seven days: a lever
//! forgotten after an incident must not become the configuration). A call
//! that starts at or after its end does not see it. It is removed, with one
//! INFO event (target `retries::control`), when its time runs out, by a
//! timer on the tokio runtime it was installed from; installed outside a
//! runtime, by the first call or [`list`] after its end.
//!
//! # Sources
//!
//! One model, three sources: this module's functions ([`set`], [`remove`],
//! [`list`], [`replace`]); a file watched and reloaded (`watch`, feature
//! `config`); and an admin endpoint (`retries_tower::admin`). Every change
//! is an INFO event (source, who, call, old value, new value, time to
//! live) and the metric `retry.control.changes`; `retry.control.overrides`
//! is the number in force. The call span of a call under an override
//! carries it (field `control`).
//!
//! # Files
//!
//! With the feature `config`, `load` reads a file once and `watch` reads it
//! again whenever its text changes. The caller's serde parser reads it
//! (`toml::from_str`, `serde_json::from_str`, `serde_yaml_ng::from_str`:
//! this crate depends on none of them). The file is a map from call names
//! (or `*`) to overrides:
//!
//! ```toml
//! ["POST /charges"]
//! ttl = "10m"             # required: a human duration, at most 7 days
//! retries = "off"         # "off" or "on"
//! unknown = "stop"        # "stop" or "reconcile-only"
//! share = 50              # percent of calls that may retry
//! breaker = "open"        # "open", "closed" or "auto"
//!
//! ["inventory::stock"]
//! ttl = "30m"
//!
//! ["inventory::stock".policy]   # a whole policy, as `retries::config` reads one
//! deadline = "2s"
//! max_attempts = 2
//! ```
//!
//! A file that does not parse or validate changes nothing: its error names
//! the parser's line and the call, and the last good set stays in force. A
//! reload replaces, in one swap, every override the file installed before;
//! an entry whose value did not change keeps its time to live where it was
//! (the time to live of an entry counts from when its value was first
//! read).
//!
//! # Cost
//!
//! With no override installed, a call pays one atomic load (`ready`: 190
//! instructions against 185 before, `tests/bench/README.md`). With
//! overrides installed, a call reads the set (a read lock and a reference
//! count) and makes one hash look-up of its name.
//!
//! ```
//! use std::time::Duration;
//! use retries::control::{self, Override, Unknown};
//!
//! // Stop resending unknown outcomes everywhere for ten minutes.
//! control::set("*", Override::new().unknown(Unknown::Stop), Duration::from_secs(600)).unwrap();
//! assert_eq!(control::list().len(), 1);
//! control::remove("*");
//! ```

#[cfg(feature = "config")]
mod file;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use crate::policy::{Policy, PolicyError};

#[cfg(feature = "config")]
pub use file::{OneOverride, Overrides, load};
#[cfg(all(feature = "config", feature = "tokio"))]
pub use file::{Watch, watch};

/// The longest time to live of an override: seven days.
pub const MAX_TTL: Duration = Duration::from_hours(7 * 24);

/// What an override does to the unknown outcomes of its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unknown {
    /// Never sent again; `reconcile` still runs, and a call whose look-up
    /// finds nothing stops.
    Stop,
    /// Sent again only after `reconcile` said the work was not done.
    ReconcileOnly,
}

/// A breaker forced by an override.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Force {
    /// Refuse every call at once, as an open breaker does.
    Open,
    /// Admit every call; the breaker is not consulted.
    Closed,
    /// The breaker decides (the same as no `breaker` lever).
    Auto,
}

/// What one override changes: each lever is left as the call has it
/// unless set.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Override {
    retries_off: bool,
    unknown: Option<Unknown>,
    share: Option<u8>,
    policy: Option<&'static Policy>,
    breaker: Option<Force>,
}

impl Override {
    /// An override that changes nothing yet.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            retries_off: false,
            unknown: None,
            share: None,
            policy: None,
            breaker: None,
        }
    }

    /// First attempts only, no hedges.
    #[must_use]
    pub const fn retries_off(mut self) -> Self {
        self.retries_off = true;
        self
    }

    /// What to do with unknown outcomes.
    #[must_use]
    pub const fn unknown(mut self, unknown: Unknown) -> Self {
        self.unknown = Some(unknown);
        self
    }

    /// The percentage of calls that may retry (0 to 100).
    ///
    /// # Errors
    ///
    /// [`ControlError::Share`] above 100.
    pub fn share(mut self, percent: u32) -> Result<Self, ControlError> {
        let share = u8::try_from(percent)
            .ok()
            .filter(|p| *p <= 100)
            .ok_or(ControlError::Share(percent))?;
        self.share = Some(share);
        Ok(self)
    }

    /// This policy instead of the call's own.
    ///
    /// # Errors
    ///
    /// [`ControlError::Policy`] for a policy the attribute would refuse.
    pub fn policy(mut self, policy: Policy) -> Result<Self, ControlError> {
        let policy = policy.try_validated().map_err(ControlError::Policy)?;
        self.policy = Some(intern(policy));
        Ok(self)
    }

    /// The breaker forced open or closed, or left automatic.
    #[must_use]
    pub const fn breaker(mut self, force: Force) -> Self {
        self.breaker = Some(force);
        self
    }

    /// First attempts only.
    #[must_use]
    pub const fn is_retries_off(&self) -> bool {
        self.retries_off
    }

    /// The unknown-outcome lever, if set.
    #[must_use]
    pub const fn unknown_outcomes(&self) -> Option<Unknown> {
        self.unknown
    }

    /// The share of calls that may retry, if set.
    #[must_use]
    pub fn retry_share(&self) -> Option<u32> {
        self.share.map(u32::from)
    }

    /// The replacement policy, if set.
    #[must_use]
    pub const fn replacement_policy(&self) -> Option<&'static Policy> {
        self.policy
    }

    /// The breaker lever, if set.
    #[must_use]
    pub const fn forced_breaker(&self) -> Option<Force> {
        self.breaker
    }
}

impl fmt::Display for Override {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.retries_off {
            parts.push("retries=off".to_owned());
        }
        match self.unknown {
            Some(Unknown::Stop) => parts.push("unknown=stop".to_owned()),
            Some(Unknown::ReconcileOnly) => parts.push("unknown=reconcile-only".to_owned()),
            None => {}
        }
        if let Some(s) = self.share {
            parts.push(format!("share={s}%"));
        }
        if let Some(p) = self.policy {
            parts.push(format!(
                "policy=(deadline {:?}, attempts {}, attempt timeout {:?})",
                p.deadline(),
                p.max_attempts(),
                p.attempt_timeout()
            ));
        }
        match self.breaker {
            Some(Force::Open) => parts.push("breaker=open".to_owned()),
            Some(Force::Closed) => parts.push("breaker=closed".to_owned()),
            Some(Force::Auto) => parts.push("breaker=auto".to_owned()),
            None => {}
        }
        if parts.is_empty() {
            return f.write_str("nothing");
        }
        f.write_str(&parts.join(" "))
    }
}

/// Who installed an override.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// This module's functions.
    Handle,
    /// A file (`watch`, `load`; feature `config`).
    File(Arc<str>),
    /// An admin endpoint, and who it said made the change.
    Endpoint {
        /// The caller, as the endpoint's authorizer named it.
        who: Arc<str>,
    },
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Handle => f.write_str("handle"),
            Self::File(path) => write!(f, "file {path}"),
            Self::Endpoint { who } => write!(f, "endpoint ({who})"),
        }
    }
}

/// Why an override was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// An empty call name.
    #[error("an override needs a call name (or `*` for every call)")]
    EmptyName,
    /// A time to live of zero or over [`MAX_TTL`].
    #[error("time to live {0:?}: give one above zero and at most seven days")]
    Ttl(Duration),
    /// A share over 100 %.
    #[error("share {0}: give a percentage from 0 to 100")]
    Share(u32),
    /// A replacement policy the attribute would refuse.
    #[error("policy: {0}")]
    Policy(PolicyError),
    /// A file or a request body that does not parse or validate: where,
    /// and why (the parser's words, with its line, and the call name).
    #[error("{source_name}: {message}")]
    Parse {
        /// The file's path, or the endpoint.
        source_name: String,
        /// What is wrong, and where.
        message: String,
    },
}

/// One override in force, as [`list`] tells it.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    /// The call name, or `*`.
    pub call: String,
    /// What it changes.
    pub what: Override,
    /// Time left before it reverts.
    pub left: Duration,
    /// Who installed it.
    pub source: Source,
}

#[derive(Debug, Clone)]
struct Entry {
    what: Override,
    until: Instant,
    ttl: Duration,
    source: Source,
}

#[derive(Debug, Default)]
struct Set {
    by_name: HashMap<Box<str>, Entry>,
    /// The entry of `*`, also in `by_name` (read here without a second
    /// hash look-up).
    all: Option<Entry>,
}

impl Set {
    /// The override of `name`: its own, else `*`'s.
    fn of(&self, name: &str) -> Option<&Entry> {
        self.by_name.get(name).or(self.all.as_ref())
    }
}

/// Is any override installed? The one load a call pays without one.
static ANY: AtomicBool = AtomicBool::new(false);
static CURRENT: RwLock<Option<Arc<Set>>> = RwLock::new(None);
/// Writers in turn: each builds the next set from the current one.
static WRITER: Mutex<()> = Mutex::new(());
/// Replacement policies, each kept once for the life of the process (a
/// call's policy is a `&'static` reference). Bounded by the distinct
/// policies ever installed.
static POLICIES: Mutex<Vec<&'static Policy>> = Mutex::new(Vec::new());

fn intern(policy: Policy) -> &'static Policy {
    let mut all = POLICIES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(p) = all.iter().find(|p| ***p == policy) {
        return p;
    }
    let leaked: &'static Policy = Box::leak(Box::new(policy));
    all.push(leaked);
    leaked
}

fn current() -> Option<Arc<Set>> {
    CURRENT
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Replace the set by `edit`'s result, under the writer's lock; tell every
/// change.
fn write(edit: impl FnOnce(&mut HashMap<Box<str>, Entry>)) {
    let _writer = WRITER.lock().unwrap_or_else(PoisonError::into_inner);
    let mut next = current().map(|s| s.by_name.clone()).unwrap_or_default();
    edit(&mut next);
    let count = next.len();
    let set = (count > 0).then(|| {
        let all = next.get("*").cloned();
        Arc::new(Set { by_name: next, all })
    });
    *CURRENT.write().unwrap_or_else(PoisonError::into_inner) = set;
    ANY.store(count > 0, Ordering::Release);
    #[cfg(feature = "metrics")]
    metrics::gauge!("retry.control.overrides").set(count as f64);
}

fn validate(call: &str, ttl: Duration) -> Result<(), ControlError> {
    if call.trim().is_empty() {
        return Err(ControlError::EmptyName);
    }
    check_ttl(ttl)
}

/// A time to live above zero and at most [`MAX_TTL`].
fn check_ttl(ttl: Duration) -> Result<(), ControlError> {
    if ttl.is_zero() || ttl > MAX_TTL {
        return Err(ControlError::Ttl(ttl));
    }
    Ok(())
}

/// On a tokio runtime, remove what has run out when its time to live ends
/// (and say so then); elsewhere the next call or [`list`] does.
fn schedule(ttl: Duration) {
    #[cfg(feature = "tokio")]
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            tokio::time::sleep(ttl).await;
            expire(crate::time::now());
        });
    }
    #[cfg(not(feature = "tokio"))]
    let _ = ttl;
}

fn entry(what: Override, ttl: Duration, source: Source, now: Instant) -> Entry {
    Entry {
        what,
        until: crate::attempt::add(now, ttl),
        ttl,
        source,
    }
}

/// Tell one change: an INFO event and the counter.
fn told(
    change: &'static str,
    source: &Source,
    call: &str,
    old: Option<&Override>,
    new: Option<&Override>,
    ttl: Option<Duration>,
) {
    #[cfg(feature = "tracing")]
    tracing::info!(
        target: "retries::control",
        source = %source,
        call,
        old = %old.map_or_else(|| "none".to_owned(), ToString::to_string),
        new = %new.map_or_else(|| "none".to_owned(), ToString::to_string),
        ttl_s = ttl.map_or(0, |t| t.as_secs()),
        "override {change}"
    );
    #[cfg(not(feature = "tracing"))]
    let _ = (source, call, old, new, ttl);
    crate::observe::events::counter("retry.control.changes", &[("change", change)]);
}

/// Install `what` for `call` (a call name, or `*` for every call without
/// an override of its own) for `ttl`, replacing the override it had.
///
/// # Errors
///
/// An empty name, or a time to live of zero or over [`MAX_TTL`].
pub fn set(call: &str, what: Override, ttl: Duration) -> Result<(), ControlError> {
    set_by(call, what, ttl, Source::Handle)
}

/// [`set`], telling who made the change (an admin endpoint's caller).
///
/// # Errors
///
/// As [`set`].
#[allow(clippy::needless_pass_by_value)] // kept: cloned into the entry
pub fn set_by(
    call: &str,
    what: Override,
    ttl: Duration,
    source: Source,
) -> Result<(), ControlError> {
    validate(call, ttl)?;
    let now = crate::time::now();
    write(|set| {
        let old = set.insert(call.into(), entry(what, ttl, source.clone(), now));
        told(
            if old.is_some() { "changed" } else { "set" },
            &source,
            call,
            old.as_ref().map(|e| &e.what),
            Some(&what),
            Some(ttl),
        );
    });
    schedule(ttl);
    Ok(())
}

/// Remove the override of `call`; `false` if it had none.
#[allow(clippy::must_use_candidate)] // the removal is the point
pub fn remove(call: &str) -> bool {
    remove_by(call, &Source::Handle)
}

/// [`remove`], telling who made the change.
#[allow(clippy::must_use_candidate)] // the removal is the point
pub fn remove_by(call: &str, source: &Source) -> bool {
    let mut removed = false;
    write(|set| {
        if let Some(old) = set.remove(call) {
            removed = true;
            told("removed", source, call, Some(&old.what), None, None);
        }
    });
    removed
}

/// Replace every override `source` installed by `entries`, in one swap
/// (the overrides of other sources stay). An entry whose call and value
/// are unchanged keeps its time to live where it was.
///
/// # Errors
///
/// The first entry with an empty name or a bad time to live; nothing is
/// changed then.
pub fn replace(
    source: &Source,
    entries: &[(String, Override, Duration)],
) -> Result<(), ControlError> {
    for (call, _, ttl) in entries {
        validate(call, *ttl)?;
    }
    let now = crate::time::now();
    write(|set| {
        let mut kept: HashMap<Box<str>, Entry> = HashMap::new();
        for (call, what, ttl) in entries {
            let same = set
                .get(call.as_str())
                .filter(|e| e.source == *source && e.what == *what && e.ttl == *ttl)
                .cloned();
            if let Some(e) = same {
                kept.insert(call.as_str().into(), e);
            } else {
                let old = set.get(call.as_str()).map(|e| e.what);
                told(
                    if old.is_some() { "changed" } else { "set" },
                    source,
                    call,
                    old.as_ref(),
                    Some(what),
                    Some(*ttl),
                );
                kept.insert(
                    call.as_str().into(),
                    entry(*what, *ttl, source.clone(), now),
                );
            }
        }
        set.retain(|call, e| {
            let gone = e.source == *source && !kept.contains_key(call);
            if gone {
                told("removed", source, call, Some(&e.what), None, None);
            }
            !gone && !kept.contains_key(call)
        });
        set.extend(kept);
    });
    for (_, _, ttl) in entries {
        schedule(*ttl);
    }
    Ok(())
}

/// The overrides in force, with the time each has left.
#[must_use]
pub fn list() -> Vec<Listed> {
    let now = crate::time::now();
    expire(now);
    let Some(set) = current() else {
        return Vec::new();
    };
    let mut all: Vec<Listed> = set
        .by_name
        .iter()
        .map(|(call, e)| Listed {
            call: call.to_string(),
            what: e.what,
            left: e.until.saturating_duration_since(now),
            source: e.source.clone(),
        })
        .collect();
    all.sort_by(|a, b| a.call.cmp(&b.call));
    all
}

/// Remove every override.
pub fn clear() {
    write(|set| {
        for (call, e) in set.drain() {
            told("removed", &Source::Handle, &call, Some(&e.what), None, None);
        }
    });
}

/// Remove what has run out, and say so.
fn expire(now: Instant) {
    let Some(set) = current() else { return };
    if set.by_name.values().all(|e| e.until > now) {
        return;
    }
    write(|set| {
        set.retain(|call, e| {
            let live = e.until > now;
            if !live {
                #[cfg(feature = "tracing")]
                tracing::info!(
                    target: "retries::control",
                    source = %e.source,
                    call = &**call,
                    old = %e.what,
                    "override expired: reverted"
                );
                #[cfg(not(feature = "tracing"))]
                let _ = call;
                crate::observe::events::counter("retry.control.changes", &[("change", "expired")]);
            }
            live
        });
    });
}

/// What the engine applies to one call (private to the crate).
pub(crate) mod applied {
    /// The call makes its first attempt only (no hedges).
    pub(crate) const ONE_ATTEMPT: u8 = 1;
    /// Unknown outcomes: never sent again.
    pub(crate) const UNKNOWN_STOP: u8 = 2;
    /// Unknown outcomes: only after `reconcile`.
    pub(crate) const UNKNOWN_RECONCILE: u8 = 4;
    /// The breaker forced open.
    pub(crate) const BREAKER_OPEN: u8 = 8;
    /// The breaker forced closed.
    pub(crate) const BREAKER_CLOSED: u8 = 16;
    /// An override applies (whatever it changes).
    pub(crate) const APPLIES: u8 = 128;
}

/// Is any override installed? One atomic load.
#[inline]
pub(crate) fn installed() -> bool {
    ANY.load(Ordering::Relaxed)
}

/// The override of a call named `name` starting now: its flags (0 for
/// none), and its replacement policy.
#[cold]
#[inline(never)]
pub(crate) fn applied(name: &str) -> (u8, Option<&'static Policy>) {
    let Some(set) = current() else {
        return (0, None);
    };
    let Some(e) = set.of(name) else {
        return (0, None);
    };
    let now = crate::time::now();
    if e.until <= now {
        drop(set);
        expire(now);
        return applied(name);
    }
    let what = e.what;
    let mut flags = applied::APPLIES;
    if what.retries_off {
        flags |= applied::ONE_ATTEMPT;
    }
    if let Some(share) = what.share
        && rand::random_range(0..100u8) >= share
    {
        flags |= applied::ONE_ATTEMPT;
    }
    match what.unknown {
        Some(Unknown::Stop) => flags |= applied::UNKNOWN_STOP,
        Some(Unknown::ReconcileOnly) => flags |= applied::UNKNOWN_RECONCILE,
        None => {}
    }
    match what.breaker {
        Some(Force::Open) => flags |= applied::BREAKER_OPEN,
        Some(Force::Closed) => flags |= applied::BREAKER_CLOSED,
        Some(Force::Auto) | None => {}
    }
    (flags, what.policy)
}

/// The override of `name`, for its call's span.
#[cfg(feature = "tracing")]
pub(crate) fn of(name: &str) -> Option<Override> {
    current()?.of(name).map(|e| e.what)
}
