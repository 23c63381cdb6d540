//! The adaptive kind of [`Concurrency`](super::Concurrency) (issue 63,
//! item 3): a limit that finds the server's capacity from the attempts of
//! the calls holding its slots.
//!
//! Each attempt of a call holding a slot tells the limit how long it took
//! and how it ended:
//!
//! * **an overloaded verdict** (429, 503 with a pause, `RESOURCE_EXHAUSTED`,
//!   a `ShedLayer`'s refusal) cuts the limit to four fifths at once, at most
//!   once per round trip (the answers of one burst are one signal, as TCP
//!   halves its window once per window);
//! * **a success** is a round-trip sample. The limit keeps the shortest
//!   sample of the last 10 to 20 seconds as the unloaded round trip (the
//!   baseline), and a moving average of the samples over about a limit's
//!   worth of them. A sample within [`TOLERANCE`] of the baseline, while
//!   at least half the slots are in use, grows the limit: by one slot per
//!   sample until the first cut (it doubles each round trip, so the
//!   capacity is found in a few), then by one slot per four limits' worth
//!   of samples (one every four round trips: probing for more, slowly
//!   enough that it spends few round trips past the capacity before the
//!   first queued answer comes back). A sample past it (a request
//!   that queued at the server) shrinks it, at most once per unloaded
//!   round trip, to what the server takes without a queue less 5 % of
//!   headroom, but never by more than half at once (a client starved of
//!   CPU sees fewer successes than the server could give). What the server
//!   takes is measured only while it is exceeded: the successes are
//!   counted in windows of one unloaded round trip; of the windows closed
//!   within the last eight unloaded round trips, those from the oldest
//!   with a queued answer in it to the newest (at least three) give the
//!   successes per unloaded round trip (by Little's law, the requests the
//!   server works on at once; BBR's estimate of a path's capacity). They
//!   are summed before they are divided: a client that falls behind counts
//!   a burst of answers late, in one window instead of the one before, and
//!   on a busy machine the most of single windows overstated a capacity of
//!   40 as 58. A window stretched past two unloaded round trips by a lull
//!   in the answers measured the lull and is left out. A queued sample with
//!   no such recent window cuts nothing (it is a pause of the machine, or
//!   the first sign of a queue whose window has not closed yet), nor does
//!   one while the limit is already under 95 % of the capacity. The
//!   limit's sawtooth then runs from 37 to 41 against a server that takes
//!   40, about three round trips in twenty at 41, where one request in
//!   forty queues;
//! * a cut-off attempt (its `attempt_timeout`) is a sample of the time it
//!   was given; other failures tell nothing about capacity.
//!
//! Chosen where the issue was silent, and said here: the limit starts at
//! its floor's double, within its ceiling; the tolerance is 50 %, the
//! issue's own yardstick for latency under load (a server whose latency
//! rises smoothly with load is let rise that far; one that queues a
//! request for a whole service time is kept out of its queue, and a
//! machine's scheduling noise is not mistaken for a queue); a hedged
//! call's copies do not feed it (their slots are one, their round trips
//! several).

use std::time::{Duration, Instant};

/// How far a round trip may rise over the unloaded one before it counts
/// as queued and shrinks the limit: 50 %.
pub const TOLERANCE: f64 = 1.5;

/// The cut of an overloaded verdict.
const CUT: f64 = 0.8;

/// The headroom a queued round trip's cut leaves under the capacity it
/// estimates.
const HEADROOM: f64 = 0.95;

/// How many windows of one baseline round trip, each with a queued
/// answer in it, the capacity is measured over at most; and how many
/// baseline round trips old such a window may be (the capacity of a
/// server is known only while it is being exceeded).
const WINDOWS: usize = 8;

/// Past the first cut, the limit grows by a slot every this many round
/// trips.
const PROBE: f64 = 4.0;

/// The baseline is the shortest round trip of the current and the
/// previous window of this length.
const BASELINE_WINDOW: Duration = Duration::from_secs(10);

/// The learning state of an adaptive limit.
#[derive(Debug)]
pub(crate) struct Adaptive {
    pub(crate) floor: u32,
    pub(crate) ceiling: u32,
    state: std::sync::Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The limit, fractional: it moves by less than a slot per sample.
    limit: f64,
    /// Permits in existence, held or free.
    issued: u32,
    /// Permits to withhold as they are given back (the limit shrank below
    /// what is held).
    debt: u32,
    /// The moving average of round trips, in nanoseconds (0: no sample).
    average: f64,
    /// The shortest round trip of the current window and the one before.
    shortest: (Option<Duration>, Option<Duration>),
    /// When the current baseline window began.
    window_from: Option<Instant>,
    /// The last cut (for an overloaded verdict or a queued round trip);
    /// none yet: the limit grows by a slot per sample.
    last_cut: Option<Instant>,
    /// The current window of one baseline round trip: its successes,
    /// when it began, and whether one of them had queued.
    ended: (u32, Option<Instant>, bool),
    /// The last windows, newest first.
    windows: [Window; WINDOWS],
}

/// A closed window of about one unloaded round trip.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    /// The successes counted in it.
    count: u32,
    /// Its length (zero: stretched past two unloaded round trips by a lull
    /// in the answers, it measured the lull, not the server).
    span: Duration,
    /// When it closed (`None`: not yet a window).
    closed: Option<Instant>,
    /// Whether one of its successes had queued at the server.
    queued: bool,
}

/// What an attempt told the limit.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sample {
    /// It succeeded (or was cut off at its time limit) after this long.
    RoundTrip(Duration),
    /// The server refused it as overloaded.
    Overloaded,
}

impl Adaptive {
    /// A state for `floor..=ceiling` slots, starting at `start` (the
    /// permits the semaphore was made with).
    pub(crate) fn new(floor: u32, ceiling: u32, start: u32) -> Self {
        Self {
            floor,
            ceiling,
            state: std::sync::Mutex::new(State {
                limit: f64::from(start),
                issued: start,
                debt: 0,
                average: 0.0,
                shortest: (None, None),
                window_from: None,
                last_cut: None,
                ended: (0, None, false),
                windows: [Window {
                    count: 0,
                    span: Duration::ZERO,
                    closed: None,
                    queued: false,
                }; WINDOWS],
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The limit now, in whole slots, and the permits in existence (held
    /// or free; more than the limit while a shrink waits for slots to come
    /// back).
    pub(crate) fn current(&self) -> (u32, u32) {
        let s = self.state();
        (s.issued - s.debt, s.issued)
    }

    /// A held permit comes back: withheld if the limit shrank below what is
    /// held, else freed.
    pub(crate) fn give_back(&self, semaphore: &tokio::sync::Semaphore) {
        let mut s = self.state();
        if s.debt > 0 {
            s.debt -= 1;
            s.issued -= 1;
        } else {
            semaphore.add_permits(1);
        }
    }

    /// Learn from one attempt at `now`; `semaphore` is the limit's.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )] // nanoseconds and slots, far inside f64's exact integers
    pub(crate) fn learn(&self, sample: Sample, now: Instant, semaphore: &tokio::sync::Semaphore) {
        let mut s = self.state();
        let (floor, ceiling) = (f64::from(self.floor), f64::from(self.ceiling));
        match sample {
            Sample::Overloaded => {
                // One cut per round trip: the answers of one burst are one
                // signal.
                let round_trip = Duration::from_nanos(s.average as u64);
                if s.last_cut
                    .is_none_or(|t| now.saturating_duration_since(t) >= round_trip)
                {
                    s.limit = (s.limit * CUT).max(floor);
                    s.last_cut = Some(now);
                }
            }
            Sample::RoundTrip(rtt) => {
                let from = *s.window_from.get_or_insert(now);
                if now.saturating_duration_since(from) >= BASELINE_WINDOW {
                    s.shortest = (None, s.shortest.0);
                    s.window_from = Some(now);
                }
                s.shortest.0 = Some(s.shortest.0.map_or(rtt, |m| m.min(rtt)));
                let baseline = match s.shortest {
                    (Some(a), Some(b)) => a.min(b),
                    (a, b) => a.or(b).unwrap_or(rtt),
                };
                let queued = rtt.as_secs_f64() > baseline.as_secs_f64() * TOLERANCE;
                // The successes within one baseline round trip.
                let began = *s.ended.1.get_or_insert(now);
                let span = now.saturating_duration_since(began);
                if span >= baseline {
                    s.windows.rotate_right(1);
                    s.windows[0] = Window {
                        count: s.ended.0,
                        span: if span <= baseline.saturating_mul(2) {
                            span
                        } else {
                            Duration::ZERO
                        },
                        closed: Some(now),
                        queued: s.ended.2,
                    };
                    s.ended = (0, Some(now), false);
                }
                s.ended.0 += 1;
                s.ended.2 |= queued;
                let capacity = capacity(&s.windows, baseline, now);
                let baseline = (baseline.as_nanos() as f64).max(1.0);
                let n = rtt.as_nanos() as f64;
                let weight = 1.0 / s.limit.max(1.0);
                s.average = if s.average == 0.0 {
                    n
                } else {
                    s.average + (n - s.average) * weight
                };
                if n <= baseline * TOLERANCE {
                    // Grow only a limit in use: idle slots prove nothing.
                    let free = u32::try_from(semaphore.available_permits()).unwrap_or(u32::MAX);
                    let in_use = f64::from(s.issued.saturating_sub(free));
                    if in_use * 2.0 >= s.limit {
                        let step = if s.last_cut.is_some() {
                            weight / PROBE
                        } else {
                            1.0
                        };
                        s.limit = (s.limit + step).min(ceiling);
                    }
                } else if let Some(capacity) = capacity
                    && HEADROOM * capacity < s.limit
                    && s.last_cut.is_none_or(|t| {
                        now.saturating_duration_since(t).as_secs_f64() * 1e9 >= baseline
                    })
                {
                    // The cut's target is absolute: one per unloaded round
                    // trip keeps only the halving from compounding.
                    let to = (HEADROOM * capacity).max(s.limit / 2.0);
                    s.limit = to.max(floor);
                    s.last_cut = Some(now);
                }
            }
        }
        let target = (s.limit as u32).clamp(self.floor, self.ceiling);
        let effective = s.issued - s.debt;
        if target > effective {
            let mut more = target - effective;
            let cancelled = more.min(s.debt);
            s.debt -= cancelled;
            more -= cancelled;
            if more > 0 {
                semaphore.add_permits(more as usize);
                s.issued += more;
            }
        } else if target < effective {
            let fewer = effective - target;
            let forgotten =
                u32::try_from(semaphore.forget_permits(fewer as usize)).unwrap_or(fewer);
            s.issued -= forgotten;
            s.debt += fewer - forgotten;
        }
    }
}

/// What the server takes without a queue, by Little's law: the successes
/// per unloaded round trip, measured while the server was exceeded. Of
/// the `windows` closed within the last [`WINDOWS`] unloaded round trips,
/// those from the oldest with a queued success in it to the newest (at
/// least the newest three) are summed, successes over lengths, so that a
/// burst counted late in one window and missing from the next cancels
/// out. `None` while no window that recent had a queued success: a slow
/// answer then (or one in a window a lull stretched) is a pause of the
/// machine, or the first sign of a queue whose window has yet to close,
/// and cuts nothing.
fn capacity(windows: &[Window], baseline: Duration, now: Instant) -> Option<f64> {
    let fresh = baseline.saturating_mul(WINDOWS as u32);
    let recent = windows
        .iter()
        .take_while(|w| {
            w.closed
                .is_some_and(|t| now.saturating_duration_since(t) <= fresh)
        })
        .count();
    let oldest_queued = windows[..recent]
        .iter()
        .rposition(|w| w.queued && !w.span.is_zero())?;
    let (count, span) = windows[..=oldest_queued.max(2).min(recent - 1)]
        .iter()
        .filter(|w| !w.span.is_zero())
        .fold((0u32, Duration::ZERO), |(c, d), w| {
            (c + w.count, d + w.span)
        });
    (!span.is_zero()).then(|| f64::from(count) * baseline.as_secs_f64() / span.as_secs_f64())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use tokio::sync::Semaphore;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Every free permit of `s` taken: all slots in use.
    fn busy(s: &Semaphore) {
        s.forget_permits(s.available_permits());
    }

    #[test]
    fn round_trips_at_the_baseline_grow_it_fast_then_by_one_per_four_round_trips() {
        let s = Semaphore::new(10);
        let a = Adaptive::new(5, 100, 10);
        let t0 = Instant::now();
        busy(&s);
        // Until the first cut, a slot per sample.
        for i in 0..3 {
            a.learn(Sample::RoundTrip(ms(20)), t0 + ms(i), &s);
        }
        assert_eq!(a.current(), (13, 13));
        assert_eq!(s.available_permits(), 3);
        busy(&s);
        // An overload cuts it to 10.4; after that, each sample at the
        // baseline adds about a fortieth of a slot (one per four limits'
        // worth): 26 take it past 11.
        a.learn(Sample::Overloaded, t0 + ms(3), &s);
        assert_eq!(a.current().0, 10);
        for i in 0..25 {
            a.learn(Sample::RoundTrip(ms(20)), t0 + ms(10 + i), &s);
        }
        assert_eq!(a.current().0, 10);
        a.learn(Sample::RoundTrip(ms(20)), t0 + ms(35), &s);
        assert_eq!(a.current().0, 11);
    }

    #[test]
    fn idle_slots_do_not_grow_it() {
        let s = Semaphore::new(10);
        let a = Adaptive::new(5, 100, 10);
        let t0 = Instant::now();
        for i in 0..100 {
            a.learn(Sample::RoundTrip(ms(20)), t0 + ms(i), &s);
        }
        assert_eq!(a.current().0, 10);
    }

    #[test]
    fn an_overloaded_verdict_cuts_at_once_once_per_round_trip() {
        let s = Semaphore::new(40);
        let a = Adaptive::new(5, 100, 40);
        let t0 = Instant::now();
        a.learn(Sample::RoundTrip(ms(20)), t0, &s);
        a.learn(Sample::Overloaded, t0 + ms(1), &s);
        assert_eq!(a.current().0, 32);
        // The same burst's other refusals: no second cut within 20 ms.
        a.learn(Sample::Overloaded, t0 + ms(5), &s);
        assert_eq!(a.current().0, 32);
        a.learn(Sample::Overloaded, t0 + ms(22), &s);
        assert_eq!(a.current().0, 25);
        // Never under the floor.
        for i in 0..20 {
            a.learn(Sample::Overloaded, t0 + ms(100 * (i + 1)), &s);
        }
        assert_eq!(a.current().0, 5);
        assert_eq!(s.available_permits(), 5);
    }

    #[test]
    fn queued_round_trips_cut_it_to_what_the_server_takes() {
        let s = Semaphore::new(60);
        let a = Adaptive::new(5, 100, 60);
        let t0 = Instant::now();
        busy(&s);
        // A cut ends the fast start.
        a.learn(Sample::Overloaded, t0, &s);
        assert_eq!(a.current().0, 48);
        // Unloaded: 20 ms. Then a server that ends 24 requests every 20 ms
        // (its capacity) answers the 48 in flight in 40 ms: queued.
        a.learn(Sample::RoundTrip(ms(20)), t0 + ms(100), &s);
        let mut limits = Vec::new();
        for i in 1..=120u32 {
            let at = t0 + ms(100) + Duration::from_micros(u64::from(i) * 20_000 / 24);
            a.learn(Sample::RoundTrip(ms(40)), at, &s);
            limits.push(a.current().0);
        }
        // No cut before a window of one baseline (20 ms) with a queued
        // answer in it has closed: the capacity is unknown until then.
        assert!(limits[..22].iter().all(|&n| n == 48), "{limits:?}");
        // Then toward 95 % of the successes per window (24), by at most
        // half at once: 24 first, 22 one unloaded round trip later, and no
        // further while the limit is under it.
        assert_eq!(limits[23], 24, "{limits:?}");
        let last = limits[119];
        assert_eq!(last, 22, "{limits:?}");
        assert!(limits[80..].iter().all(|&n| n == last), "{limits:?}");
        // What is held is withheld as it comes back, not taken away.
        let (limit, issued) = a.current();
        assert_eq!(issued, 60);
        for _ in 0..(issued - limit) {
            a.give_back(&s);
        }
        assert_eq!(a.current(), (limit, limit));
        assert_eq!(s.available_permits(), 0);
        a.give_back(&s);
        assert_eq!(s.available_permits(), 1);
    }

    #[test]
    fn a_lone_slow_answer_cuts_nothing() {
        let s = Semaphore::new(30);
        let a = Adaptive::new(5, 100, 30);
        let t0 = Instant::now();
        busy(&s);
        a.learn(Sample::Overloaded, t0, &s);
        assert_eq!(a.current().0, 24);
        // A healthy flow at 20 ms, then an answer held up by a pause of
        // the machine, and another after a lull: no window had a queue in
        // it before the first, and the one the lull stretched (60 ms)
        // measured the lull, not the server: nothing is cut.
        for i in 0..100 {
            a.learn(Sample::RoundTrip(ms(20)), t0 + ms(100 + i), &s);
        }
        let before = a.current().0;
        assert_eq!(before, 25);
        a.learn(Sample::RoundTrip(ms(90)), t0 + ms(201), &s);
        a.learn(Sample::RoundTrip(ms(90)), t0 + ms(260), &s);
        assert_eq!(a.current().0, before);
    }

    #[test]
    fn answers_counted_late_do_not_overstate_the_capacity() {
        let s = Semaphore::new(60);
        let a = Adaptive::new(5, 100, 60);
        let t0 = Instant::now();
        busy(&s);
        a.learn(Sample::Overloaded, t0, &s);
        a.learn(Sample::RoundTrip(ms(20)), t0 + ms(100), &s);
        // A server that ends 24 requests every 20 ms, all of them queued,
        // seen by a client that falls behind every other window: 32
        // answers counted in one window, 16 in the next.
        let mut at = t0 + ms(100);
        for w in 0..12 {
            let n: u32 = if w % 2 == 0 { 32 } else { 16 };
            for i in 0..n {
                let t = at + Duration::from_micros(u64::from(i) * 20_000 / u64::from(n));
                a.learn(Sample::RoundTrip(ms(40)), t, &s);
            }
            at += ms(20);
        }
        // 95 % of 24, not of 32.
        assert_eq!(a.current().0, 22);
    }
}
