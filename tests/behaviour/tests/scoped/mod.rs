//! Scoped tracing subscribers that see every event of their thread, even
//! while tests without a subscriber run beside them in the same binary.
//!
//! `tracing-core` caches each callsite's interest the first time the
//! callsite is hit. While at most one dispatcher is registered, it computes
//! that interest from the registering thread's own default alone and
//! without a lock, so a test without a subscriber that hits a callsite first
//! caches "never" for everyone, including a scoped subscriber on another
//! thread. Two dispatchers kept alive for the whole binary take the locked
//! path that asks every live dispatcher.

use std::sync::OnceLock;

use tracing::Dispatch;
use tracing::subscriber::NoSubscriber;

/// Run `f` with `subscriber` as this thread's default.
pub(crate) fn with_scoped<S, R>(subscriber: S, f: impl FnOnce() -> R) -> R
where
    S: tracing::Subscriber + Send + Sync + 'static,
{
    static KEEP: OnceLock<[Dispatch; 2]> = OnceLock::new();
    KEEP.get_or_init(|| {
        [
            Dispatch::new(NoSubscriber::default()),
            Dispatch::new(NoSubscriber::default()),
        ]
    });
    tracing::subscriber::with_default(subscriber, f)
}
