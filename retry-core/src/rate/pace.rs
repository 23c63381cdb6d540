//! [`Pace`]: the quota a server announced, kept so that what is left lasts
//! until the quota is whole again (issue 63, item 1), and [`Starts`], what
//! an attempt's start draws from: the caller's [`RateLimit`] and a
//! server's [`Pace`].
//!
//! A door (the HTTP doors read `RateLimit`, `X-RateLimit-*`) tells a
//! `Pace` each announcement; every attempt through the door reserves its
//! start from it, as from a [`RateLimit`], within its call's deadline.

use std::time::{Duration, Instant};

use super::RateLimit;
use crate::attempt::add;
use crate::failure::Reason;

/// The time before a window's end kept free of starts (at most a tenth of
/// the time left): a start delayed on a busy machine still reaches the
/// server within the window it was counted in.
const GUARD: Duration = Duration::from_millis(50);

/// The most starts past a window's end a pace keeps for the next.
const AHEAD: usize = 4096;

/// The pace of first attempts (and retries, and hedged copies) that makes
/// the quota a server announced last until it is whole again: told each
/// announcement ([`announce`](Self::announce): so many requests left, the
/// quota whole again in so long), it spreads the starts left evenly over
/// the time left (less a guard of a tenth of it, at most 50 ms, so that a
/// start delayed on a busy machine still reaches the server within the
/// window it was counted in), and holds the next start until the reset
/// once nothing is left. Before any announcement, and once the announced reset has passed,
/// it holds nothing back.
///
/// Attempts draw from it as from a [`RateLimit`]: a start that would come
/// too late for its call's deadline (less `min_attempt`) is not reserved,
/// and the call stops at once with
/// [`Reason::OverQuota`](crate::Reason::OverQuota), nothing sent.
///
/// Chosen where the drafts are silent, and said here:
///
/// * **Which window an answer tells of.** An answer to a request sent
///   before the kept window's end tells of that window; one to a request
///   sent at or after it starts the next, and one to a request sent before
///   the kept window began tells of an older one and is not taken (a
///   request sent late in a window may be answered after it ended, with
///   the old window's count: taken as the next window's, it would hold
///   every start for a whole window).
/// * **Starts past the window's end** (the starts held until the reset, a
///   retry's after a long pause) cannot be counted in a window not yet
///   announced. They are spaced as the window began (its length over its
///   quota, from its first announcement), not sent at once at the reset:
///   a burst answered out of order would leave the next window's count
///   unsure. They are kept, and the next window's first announcement has
///   those after its request taken off what it says is left (the server
///   had not seen them yet).
/// * **Resets sent in whole seconds.** The IETF draft's `t` and most
///   `X-RateLimit-Reset` values are whole seconds, rounded up by the
///   servers that say how they round. Each answer of a window bounds its
///   end from above, so the earliest is kept: within a window an answer
///   can only move the end earlier.
/// * **What is left** is the lower of the server's latest count and this
///   pace's own (each start reserved counts one at once): answers to
///   requests sent before later ones count fewer of them.
/// * **A pace per server, per client**: it is a value the door keeps (per
///   authority for the HTTP doors); several clients of one quota each keep
///   their own, and may together overrun it between two announcements.
///
/// ```
/// use std::time::Duration;
/// use retries::limit::Pace;
/// use retries::{Attempt, Policy};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let pace = Pace::new();
/// // The server said: 4 left, whole again in 2 s.
/// let now = tokio::time::Instant::now().into_std();
/// pace.announce(4, Duration::from_secs(2), now, now);
/// let policy = Policy::new(Duration::from_secs(10));
/// let t0 = tokio::time::Instant::now();
/// for _ in 0..5 {
///     let r: Result<(), std::io::Error> =
///         retries::call(&policy).idempotent().pace(&pace).run(async |_: &Attempt| Ok(())).await;
///     r.unwrap();
/// }
/// // Four starts 500 ms apart, the fifth at the reset.
/// assert_eq!(t0.elapsed(), Duration::from_secs(2));
/// # }
/// ```
#[derive(Debug, Default)]
pub struct Pace {
    state: std::sync::Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The end of the announced window (`None`: nothing announced).
    until: Option<Instant>,
    /// The end of the window before it: answers to requests sent before
    /// it tell of an older window.
    from: Option<Instant>,
    /// Starts reserved at or after `until`, not counted yet (at most
    /// [`AHEAD`]; beyond that the oldest are forgotten).
    ahead: Vec<Instant>,
    /// The spacing of starts past `until`: the window's length over its
    /// quota, as its first announcement said.
    spacing: Duration,
    /// The earliest next start past `until`.
    after: Option<Instant>,
    /// Starts left before `until`.
    left: u64,
    /// The earliest next start, once one was reserved in the window.
    next: Option<Instant>,
}

impl Pace {
    /// A pace with nothing announced: it holds nothing back.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            state: std::sync::Mutex::new(State {
                until: None,
                from: None,
                ahead: Vec::new(),
                spacing: Duration::ZERO,
                after: None,
                left: 0,
                next: None,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A server announced, in its answer to a request `sent` then and
    /// `received` then, that `remaining` requests are left and that the
    /// quota is whole again `reset` after it was received (see the type's
    /// docs for how announcements combine).
    pub fn announce(&self, remaining: u64, reset: Duration, sent: Instant, received: Instant) {
        let end = add(received, reset);
        let mut s = self.state();
        if s.from.is_some_and(|from| sent < from) {
            return;
        }
        match s.until {
            Some(until) if sent < until => {
                s.until = Some(until.min(end));
                s.left = s.left.min(remaining);
            }
            _ => {
                // Starts the server had not seen when it answered.
                let unseen = s.ahead.iter().filter(|&&a| a > sent).count() as u64;
                s.ahead.retain(|&a| a >= end);
                s.from = s.until;
                s.until = Some(end);
                s.left = remaining.saturating_sub(unseen);
                s.next = None;
                s.after = None;
                if let Ok(n @ 1..) = u32::try_from(remaining) {
                    s.spacing = reset / n;
                }
            }
        }
    }

    /// The announced window's end and the starts left in it, if a window
    /// is announced and has not ended at `now`.
    #[must_use]
    pub fn window(&self, now: Instant) -> Option<(Instant, u64)> {
        let s = self.state();
        s.until.filter(|&u| now < u).map(|u| (u, s.left))
    }

    /// Reserve the start of one attempt at `at` or later, no later than
    /// `latest`: the instant it may start, or `None` (nothing reserved)
    /// when that would be after `latest`.
    pub(crate) fn reserve(&self, at: Instant, latest: Instant) -> Option<Instant> {
        let mut s = self.state();
        let Some(until) = s.until else {
            return Some(at);
        };
        let mut start = s.next.map_or(at, |n| n.max(at));
        if s.left == 0 {
            start = start.max(until);
        }
        if start > latest {
            return None;
        }
        if start >= until {
            // The window has ended by then: spaced as it began, and
            // counted in the next one.
            let start = s.after.map_or(start, |a| a.max(start));
            if start > latest {
                return None;
            }
            if s.ahead.len() >= AHEAD {
                s.ahead.remove(0);
            }
            s.ahead.push(start);
            s.after = Some(add(start, s.spacing));
            return Some(start);
        }
        // What is left, spread evenly over the time left less a guard.
        let span = until.saturating_duration_since(start);
        let span = span.saturating_sub((span / 10).min(GUARD));
        let gap = match u32::try_from(s.left) {
            Ok(n) => span / n,
            Err(_) => Duration::ZERO,
        };
        s.left -= 1;
        s.next = Some(add(start, gap));
        Some(start)
    }
}

/// What an attempt's start draws from: the caller's rate limit and a
/// server's announced pace, either, both or neither. Copied into every
/// call's head; a call with neither pays a branch.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Starts<'a> {
    pub(crate) rate: Option<&'a RateLimit>,
    pub(crate) pace: Option<&'a Pace>,
}

impl Starts<'_> {
    /// Any start to reserve?
    #[inline]
    pub(crate) fn is_set(&self) -> bool {
        self.rate.is_some() || self.pace.is_some()
    }

    /// The start of one attempt at `at` or later, no later than `latest`,
    /// reserved from both; the reason to stop when either has none by
    /// `latest` ([`Reason::OverQuota`], [`Reason::RateLimited`]). The
    /// pace is asked first: a rate limit's start is a reservation that is
    /// not given back, so it is taken only once the pace has one to give;
    /// the attempt starts at the later of the two (the rate's then unused
    /// until then: the rate runs a little slower, never faster).
    pub(crate) fn reserve(&self, at: Instant, latest: Instant) -> Result<Instant, Reason> {
        let at = match self.pace {
            Some(p) => p.reserve(at, latest).ok_or(Reason::OverQuota)?,
            None => at,
        };
        match self.rate {
            Some(r) => r.reserve(at, latest).ok_or(Reason::RateLimited),
            None => Ok(at),
        }
    }
}

#[cfg(all(test, not(loom), feature = "tokio"))]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_left_is_spread_until_the_reset() {
        let p = Pace::new();
        let t0 = crate::time::now();
        let far = t0 + Duration::from_mins(1);
        // Nothing announced: nothing held back.
        assert_eq!(p.reserve(t0, t0), Some(t0));
        p.announce(4, Duration::from_secs(1), t0, t0);
        let starts: Vec<_> = (0..6).map(|_| p.reserve(t0, far).unwrap() - t0).collect();
        // 4 left over 1 s less its 50 ms guard: 237.5 ms apart; then
        // nothing left until the reset, and past it spaced as the window
        // began (1 s / 4).
        let us = |n| Duration::from_micros(n);
        assert_eq!(
            starts,
            [
                us(0),
                us(237_500),
                us(475_000),
                us(712_500),
                ms(1000),
                ms(1250)
            ]
        );
        assert_eq!(p.window(t0), Some((t0 + ms(1000), 0)));
        assert_eq!(p.window(t0 + ms(1000)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_after_latest_reserves_nothing() {
        let p = Pace::new();
        let t0 = crate::time::now();
        p.announce(0, Duration::from_secs(30), t0, t0);
        assert_eq!(p.reserve(t0, t0 + ms(500)), None);
        let t1 = t0 + Duration::from_secs(31);
        p.announce(2, Duration::from_secs(2), t1, t1);
        assert_eq!(p.reserve(t1, t1), Some(t1));
        // The next is 975 ms on (2 s less 50 ms, over 2): refused by an
        // earlier `latest`, and nothing was taken by asking.
        assert_eq!(p.reserve(t1, t1 + ms(974)), None);
        assert_eq!(p.reserve(t1, t1 + ms(975)), Some(t1 + ms(975)));
    }

    #[tokio::test(start_paused = true)]
    async fn answers_tell_of_the_window_their_request_was_sent_in() {
        let p = Pace::new();
        let t0 = crate::time::now();
        // Rounded up: "1 s" at 0 and at 600 ms, the window really ending
        // at 1 s. The second bounds it at 1.6 s, not earlier than 1 s: kept.
        p.announce(10, Duration::from_secs(1), t0, t0);
        p.announce(9, Duration::from_secs(1), t0 + ms(590), t0 + ms(600));
        assert_eq!(p.window(t0), Some((t0 + ms(1000), 9)));
        // A count higher than the pace's own is not taken within a window.
        p.announce(50, Duration::from_secs(1), t0 + ms(690), t0 + ms(700));
        assert_eq!(p.window(t0), Some((t0 + ms(1000), 9)));
        // An earlier end is.
        p.announce(9, Duration::ZERO, t0 + ms(795), t0 + ms(800));
        assert_eq!(p.window(t0), Some((t0 + ms(800), 9)));
        // Sent before the end, answered after it, with the old window's
        // count: it tells of the old window, and holds nothing back.
        p.announce(0, Duration::from_secs(1), t0 + ms(799), t0 + ms(805));
        assert_eq!(p.window(t0 + ms(805)), None);
        assert_eq!(p.reserve(t0 + ms(805), t0 + ms(805)), Some(t0 + ms(805)));
        // Sent after it: the next window.
        p.announce(100, Duration::from_secs(1), t0 + ms(806), t0 + ms(810));
        assert_eq!(p.window(t0 + ms(810)), Some((t0 + ms(1810), 100)));
    }

    #[tokio::test(start_paused = true)]
    async fn both_a_rate_and_a_pace() {
        let rate = RateLimit::new(1, Duration::from_secs(1), 1);
        let pace = Pace::new();
        let t0 = crate::time::now();
        let far = t0 + Duration::from_mins(1);
        pace.announce(10, Duration::from_secs(1), t0, t0);
        let s = Starts {
            rate: Some(&rate),
            pace: Some(&pace),
        };
        assert!(s.is_set() && !Starts::default().is_set());
        // The rate (1 a second) is the slower: it sets the starts.
        assert_eq!(s.reserve(t0, far), Ok(t0));
        assert_eq!(s.reserve(t0, far), Ok(t0 + ms(1000)));
        assert_eq!(s.reserve(t0, t0 + ms(1500)), Err(Reason::RateLimited));
        // The pace refuses first: the rate's start is not taken.
        pace.announce(0, Duration::from_secs(20), t0 + ms(1001), t0 + ms(1001));
        assert_eq!(
            s.reserve(t0 + ms(1001), t0 + ms(5000)),
            Err(Reason::OverQuota)
        );
        assert_eq!(rate.reserve(t0 + ms(2000), far), Some(t0 + ms(2000)));
    }
}
